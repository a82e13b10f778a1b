"""One DCP checkpoint read tensor by tensor, in one process without a process group.

DCP reassembles each tensor from the chunks whatever layout wrote them, so a tensor read here is the full
(consolidated) one; only one tensor at a time is in memory, never the whole model or optimizer state. The folder
may be local or on an object store: everything is read through its storage (checkpoint/storage). On a store every
DCP load costs requests per shard file, so whoever reads many tensors asks for them in groups (`groups`): up to
GROUP_BYTES there, one at a time locally.
"""

from __future__ import annotations

import math
import re
import warnings
from collections.abc import Iterator

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata

from llmtrain.checkpoint.storage import is_uri, storage_for
from llmtrain.checkpoint.store import DCP_METADATA, CheckpointError


GROUP_BYTES = 256 << 20  # tensors read in one DCP load from an object store


def dcp_failure(e: BaseException) -> BaseException:
    """What failed inside a DCP load: it wraps each rank's exception into one CheckpointException (a
    BaseException, which `except Exception` lets through)."""
    failures = getattr(e, "failures", None)
    if isinstance(e, CheckpointException) and failures:
        wrapped = failures[min(failures)]
        return wrapped[0] if isinstance(wrapped, tuple) else wrapped
    return e


def first_line(e: BaseException) -> str:
    e = dcp_failure(e)
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0][:300]}" if text else type(e).__name__


def natural_key(name: str) -> list:
    """layers.2 before layers.10: a stable order that reads like the model."""
    return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", name)]


def cached_reader(path: str, metadata: Metadata):
    """The storage's DCP reader of `path` that answers with `metadata`: every tensor read would otherwise fetch and
    unpickle .metadata again."""
    reader = storage_for(path).dcp_reader(path)
    reader.read_metadata = lambda *args, **kwargs: metadata
    return reader


class CheckpointReader:
    def __init__(self, path: str):
        self.path = path
        self.storage = storage_for(path)
        meta_path = self.storage.join(path, DCP_METADATA)
        if not self.storage.isfile(meta_path):
            raise CheckpointError(meta_path, "missing: not a torch.distributed.checkpoint folder, or an "
                                             "incomplete one")
        try:
            self.metadata = self.storage.dcp_reader(path).read_metadata()
        except Exception as e:  # truncated pickle, garbage, another version's classes
            raise CheckpointError(meta_path, f"unreadable DCP metadata ({first_line(e)})") from None
        self._reader = cached_reader(path, self.metadata)

    def tensors(self, prefixes: tuple[str, ...] = ("",)) -> dict[str, TensorStorageMetadata]:
        """Stored tensors whose key starts with one of `prefixes`, in natural order."""
        found = {k: md for k, md in self.metadata.state_dict_metadata.items()
                 if isinstance(md, TensorStorageMetadata) and k.startswith(prefixes)}
        return {k: found[k] for k in sorted(found, key=natural_key)}

    def files_of(self, key: str) -> list[str]:
        """The shard files holding the chunks of `key`."""
        return sorted({info.relative_path for index, info in self.metadata.storage_data.items()
                       if index.fqn == key})

    def read(self, key: str) -> torch.Tensor:
        """The full tensor stored under `key` (a flattened name such as model.layers.0.attn.q.weight)."""
        md = self.metadata.state_dict_metadata[key]
        out = torch.empty(tuple(md.size), dtype=md.properties.dtype)
        self._load({key: out}, key)
        return out

    @property
    def remote(self) -> bool:
        """On an object store: a read costs round trips, so tensors are better read in groups."""
        return is_uri(self.path)

    def nbytes(self, key: str) -> int:
        md = self.metadata.state_dict_metadata[key]
        return math.prod(md.size) * md.properties.dtype.itemsize

    def read_many(self, keys: list[str]) -> dict[str, torch.Tensor]:
        """The full tensors of `keys` in one DCP load; a failure is named as `read` names it (the group is read
        again one tensor at a time to find the one that fails)."""
        if len(keys) == 1:
            return {keys[0]: self.read(keys[0])}
        out = {}
        for key in keys:
            md = self.metadata.state_dict_metadata[key]
            out[key] = torch.empty(tuple(md.size), dtype=md.properties.dtype)
        try:
            self._load(out, keys[0])
        except CheckpointError:
            return {key: self.read(key) for key in keys}
        return out

    def read_value(self, key: str, default=None):
        """A non-tensor value (extra.step, ...); `default` when the checkpoint has none."""
        if key not in self.metadata.state_dict_metadata:
            return default
        holder = {key: default}
        self._load(holder, key)
        return holder[key]

    def _load(self, state: dict, key: str) -> None:  # `key`: the tensor a failure is named by
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "assuming the intent is to load in a single process"
                dcp.load(state, storage_reader=self._reader, no_dist=True)
        except (Exception, CheckpointException) as e:
            if not isinstance(dcp_failure(e), Exception):  # Ctrl-C while reading, passed through DCP
                raise dcp_failure(e) from None
            where = ", ".join(self.files_of(key)) or DCP_METADATA
            raise CheckpointError(self.storage.join(self.path, where), f"cannot read {key} ({first_line(e)})") from None


def groups(items: list, sizes: list[int], together: bool) -> Iterator[list]:
    """`items` in order, in runs to read in one load: each alone unless `together` (an object store), then as many
    as fit in GROUP_BYTES (one larger than that alone)."""
    group, size = [], 0
    for item, n in zip(items, sizes):
        if group and (not together or size + n > GROUP_BYTES):
            yield group
            group, size = [], 0
        group.append(item)
        size += n
    if group:
        yield group
