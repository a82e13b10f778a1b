"""One DCP checkpoint read tensor by tensor, in one process without a process group.

DCP reassembles each tensor from the chunks whatever layout wrote them, so a tensor read here is the full
(consolidated) one; only one tensor at a time is in memory, never the whole model or optimizer state.
"""

from __future__ import annotations

import os
import re
import warnings

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata

from llmtrain.checkpoint.store import DCP_METADATA, CheckpointError


def first_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0][:300]}" if text else type(e).__name__


def natural_key(name: str) -> list:
    """layers.2 before layers.10: a stable order that reads like the model."""
    return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", name)]


class _CachedReader(FileSystemReader):
    """Reads .metadata once: every tensor read would otherwise unpickle it again."""

    def __init__(self, path: str, metadata: Metadata):
        super().__init__(path)
        self._metadata = metadata

    def read_metadata(self, *args, **kwargs) -> Metadata:
        return self._metadata


class CheckpointReader:
    def __init__(self, path: str):
        self.path = path
        meta_path = os.path.join(path, DCP_METADATA)
        if not os.path.isfile(meta_path):
            raise CheckpointError(meta_path, "missing: not a torch.distributed.checkpoint folder, or an "
                                             "incomplete one")
        try:
            self.metadata = FileSystemReader(path).read_metadata()
        except Exception as e:  # truncated pickle, garbage, another version's classes
            raise CheckpointError(meta_path, f"unreadable DCP metadata ({first_line(e)})") from None
        self._reader = _CachedReader(path, self.metadata)

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

    def read_value(self, key: str, default=None):
        """A non-tensor value (extra.step, ...); `default` when the checkpoint has none."""
        if key not in self.metadata.state_dict_metadata:
            return default
        holder = {key: default}
        self._load(holder, key)
        return holder[key]

    def _load(self, state: dict, key: str) -> None:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "assuming the intent is to load in a single process"
                dcp.load(state, storage_reader=self._reader, no_dist=True)
        except Exception as e:
            where = ", ".join(self.files_of(key)) or DCP_METADATA
            raise CheckpointError(os.path.join(self.path, where), f"cannot read {key} ({first_line(e)})") from None
