"""model.init_from: weights from a Hugging Face folder of a family llmtrain reads (its adapter,
model/<family>/hf.py, names and checks them), an llmtrain safetensors export, or an llmtrain checkpoint folder
(DCP: its model tensors, consolidated whatever layout saved them). Each may be local or at an object-store URI
(s3://...): files there are read through their storage, header and tensors by byte ranges (pretrained_sources.py).

`inspect_pretrained` reads only what the files say about themselves (safetensors headers, config.json, an index)
and checks every tensor's name and shape against the model the config builds: the launcher calls it before
anything starts, so a wrong folder is one line naming the tensor, the file and both shapes. The workers then read
each parameter's full fp32 tensor by its llmtrain name (`source[name]`, one at a time; init keeps the rank's
shards of it), or all of them at once (`load`). A parameter stacked from several stored tensors (a mixture-of-experts
layer's experts, stored one by one in a Hugging Face folder) is read row by row and stacked.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch

from llmtrain.checkpoint.pretrained_match import KEY, match_pieces
from llmtrain.checkpoint.pretrained_sources import (MODEL_PREFIX, RemoteSafetensors, checkpoint_model_tensors,
                                                    checkpoint_reader, remote_torch_file)
from llmtrain.checkpoint.safetensors_io import open_safetensors, read_safetensors_header
from llmtrain.checkpoint.storage import is_uri, storage_for
from llmtrain.checkpoint.weight_map import EMBED, HEAD, POS, Piece, clean_name, state_shapes
from llmtrain.config import ConfigError
from llmtrain.model.family import FamilySpec
from llmtrain.model.registry import FAMILIES, family, family_for_hf_type, family_of

SAFETENSORS_FILE = "model.safetensors"
HF_CONFIG_FILE = "config.json"
HF_BIN_FILE = "pytorch_model.bin"
HF_INDEX_FILE = "model.safetensors.index.json"
DCP_METADATA = ".metadata"  # what makes a folder a checkpoint (DCP's index of the shards)
LLMTRAIN_FORMAT = "llmtrain"
_FLOAT_DTYPES = ("F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2")


@dataclass
class Stored:
    """One tensor of the source files, as its header (or a memory-mapped torch file) describes it."""

    file: Path | str  # a local file (Path), or a URI; a checkpoint's: the checkpoint folder
    shape: tuple[int, ...]
    floating: bool
    tensor: torch.Tensor | None = None  # torch files only: memory-mapped, read on use
    dcp_key: str | None = None  # a checkpoint's tensor: its stored key (model.<name>)


@dataclass(eq=False)
class Pretrained(Mapping):
    """A checked model.init_from source: llmtrain parameter name -> its full fp32 tensor, read when asked for."""

    path: Path | str  # a URI as a str
    spec: FamilySpec | None  # the family whose Hugging Face names the files hold; None: llmtrain names
    files: list[Path | str]
    stored: dict[str, Stored]  # by stored name
    # By llmtrain name, once checked: its one Piece, or a stacked parameter's rows in slot order.
    pieces: dict[str, list[Piece]] = field(default_factory=dict)
    expected_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)  # of the model the config builds
    # Readers kept between reads, which hold no open file: a remote file's parsed header, a checkpoint's index.
    kept: dict = field(default_factory=dict)
    checkpoint: bool = False  # an llmtrain checkpoint folder (DCP), not safetensors or torch files

    @property
    def format(self) -> str:
        return LLMTRAIN_FORMAT if self.spec is None else f"hf-{self.spec.name}"

    @property
    def format_name(self) -> str:
        if self.checkpoint:
            return "llmtrain checkpoint"
        return "llmtrain safetensors" if self.spec is None else f"HF {self.spec.title}"

    def describe(self) -> str:
        """The rank-0 log line: what was loaded from where."""
        count = sum(math.prod(p.shape(self.stored[p.key].shape)) for ps in self.pieces.values() for p in ps)
        files = f", {len(self.files)} files" if len(self.files) > 1 else ""
        return (f"{KEY}: loaded {len(self.pieces)} tensors ({count:,} parameters) from {self.path} "
                f"({self.format_name}{files})")

    def __getitem__(self, name: str) -> torch.Tensor:
        """One parameter's full fp32 tensor, read on its own from the memory-mapped files: a rank initializing its
        shards holds one full tensor at a time, not the whole model (32 GB in fp32 for an 8B)."""
        with contextlib.ExitStack() as opened:
            read = _Reader(self.stored, opened, self.kept)
            return self._assemble(name, [read(p.key) for p in self.pieces[name]])

    def __iter__(self) -> Iterator[str]:
        return iter(self.pieces)

    def __len__(self) -> int:
        return len(self.pieces)

    def load(self) -> dict[str, torch.Tensor]:
        """Full fp32 tensors with llmtrain names; the embedding (and an untied head) gets zero rows up to the
        padded vocabulary, a longer position table keeps its first seq_len rows."""
        out: dict[str, torch.Tensor] = {}
        uses = Counter(p.key for pieces in self.pieces.values() for p in pieces)
        with contextlib.ExitStack() as opened:
            read = _Reader(self.stored, opened, self.kept)
            raw: dict[str, torch.Tensor] = {}  # each stored tensor read once (GPT-2's c_attn feeds q, k, v) ...
            for name, pieces in self.pieces.items():
                for key in {p.key for p in pieces} - raw.keys():
                    raw[key] = read(key)
                out[name] = self._assemble(name, [raw[p.key] for p in pieces])
                for p in pieces:  # ... and let go of once its last piece is taken
                    uses[p.key] -= 1
                    if not uses[p.key]:
                        del raw[p.key]
        return {n: out[n] for n in self.expected_shapes}

    def _assemble(self, name: str, stored: list[torch.Tensor]) -> torch.Tensor:
        """Parameter `name` from the stored tensors of its pieces (in their order)."""
        pieces = self.pieces[name]
        rows = [p.take(t) for p, t in zip(pieces, stored)]
        t = torch.stack(rows) if pieces[0].stacked else rows[0]
        return _fit(name, t, self.expected_shapes[name])


class _Reader:
    """Reads stored tensors by name, opening each local safetensors file once while `opened` lasts; the readers
    of remote files and checkpoints are kept in `kept` (they hold no open file)."""

    def __init__(self, stored: dict[str, Stored], opened: contextlib.ExitStack, kept: dict):
        self.stored, self.opened, self.handles, self.kept = stored, opened, {}, kept

    def __call__(self, key: str) -> torch.Tensor:
        stored = self.stored[key]
        if stored.tensor is not None:
            return stored.tensor
        if stored.dcp_key is not None:
            if stored.file not in self.kept:
                self.kept[stored.file] = checkpoint_reader(stored.file)
            return self.kept[stored.file].read(stored.dcp_key)
        if isinstance(stored.file, str):
            if stored.file not in self.kept:
                self.kept[stored.file] = RemoteSafetensors(stored.file)
            return self.kept[stored.file].get_tensor(key)
        if stored.file not in self.handles:
            self.handles[stored.file] = self.opened.enter_context(open_safetensors(stored.file))
        return self.handles[stored.file].get_tensor(key)


def _fit(name: str, t: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    if name in (EMBED, HEAD) and t.shape[0] < shape[0]:
        t = torch.cat([t, t.new_zeros(shape[0] - t.shape[0], *t.shape[1:])])
    elif name == POS and t.shape[0] > shape[0]:
        t = t[: shape[0]]
    return t.to(torch.float32).contiguous().clone()


# ---- what the files hold (headers only) ----------------------------------------------------------------------


def _safetensors_entries(path: Path) -> dict[str, Stored]:
    header = read_safetensors_header(path)
    return {k: Stored(path, shape, dtype in _FLOAT_DTYPES) for k, (shape, dtype) in header.items()}


def _torch_entries(path: Path | str) -> dict[str, Stored]:
    if isinstance(path, str):
        sd = remote_torch_file(path)
    else:
        try:  # memory-mapped: nothing is read until a tensor is used
            sd = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except Exception:
            try:  # the legacy (pre-zipfile) torch format cannot be memory-mapped
                sd = torch.load(path, map_location="cpu", weights_only=True)
            except Exception as e:
                msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                raise ConfigError(KEY, f"cannot read {path}: {msg[:300]}") from None
    if isinstance(sd, dict) and isinstance(sd.get("state_dict"), dict):
        sd = sd["state_dict"]
    if not isinstance(sd, dict):
        raise ConfigError(KEY, f"{path} does not hold a dict of tensors")
    return {k: Stored(path, tuple(v.shape), v.is_floating_point(), v) for k, v in sd.items()
            if isinstance(v, torch.Tensor)}


def _file_entries(path: Path | str, kept: dict) -> dict[str, Stored]:
    if isinstance(path, str) and path.endswith(".safetensors"):
        kept[path] = RemoteSafetensors(path)
        return {k: Stored(path, shape, dtype in _FLOAT_DTYPES) for k, (shape, dtype) in kept[path].header().items()}
    if isinstance(path, str):
        return _torch_entries(path)
    return _safetensors_entries(path) if path.suffix == ".safetensors" else _torch_entries(path)


def _checkpoint_entries(path: Path | str) -> dict[str, Stored]:
    """A checkpoint folder's model tensors by parameter name (model.<name> stored)."""
    return {key[len(MODEL_PREFIX):]: Stored(path, shape, floating, dcp_key=key)
            for key, (shape, floating) in checkpoint_model_tensors(str(path)).items()}


# A local folder as pathlib.Path, a URI as str: the same few questions of either.
def _child(folder: Path | str, name: str) -> Path | str:
    return folder / name if isinstance(folder, Path) else storage_for(folder).join(folder, name)


def _is_file(path: Path | str) -> bool:
    return path.is_file() if isinstance(path, Path) else storage_for(path).isfile(path)


def _read_text(path: Path | str) -> str:
    return path.read_text() if isinstance(path, Path) else storage_for(path).read_text(path)


def _hf_weight_files(folder: Path | str) -> list[Path | str]:
    if _is_file(_child(folder, SAFETENSORS_FILE)):
        return [_child(folder, SAFETENSORS_FILE)]
    index = _child(folder, HF_INDEX_FILE)
    if _is_file(index):  # sharded: model-00001-of-0000N.safetensors
        try:
            weight_map = json.loads(_read_text(index))["weight_map"]
            shards = sorted(set(weight_map.values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise ConfigError(KEY, f"unreadable {index}: {type(e).__name__}: {e}") from None
        for shard in shards:
            if not _is_file(_child(folder, shard)):
                raise ConfigError(KEY, f"{_child(folder, shard)} (listed in {index}) is missing")
        return [_child(folder, shard) for shard in shards]
    if _is_file(_child(folder, HF_BIN_FILE)):
        return [_child(folder, HF_BIN_FILE)]
    raise ConfigError(KEY, f"{folder} has no {SAFETENSORS_FILE}, {HF_INDEX_FILE} or {HF_BIN_FILE}")


def _read_hf_config(folder: Path | str) -> dict:
    path = _child(folder, HF_CONFIG_FILE)
    try:
        conf = json.loads(_read_text(path))
    except (OSError, ValueError) as e:
        raise ConfigError(KEY, f"unreadable {path}: {e}") from None
    if not isinstance(conf, dict):
        raise ConfigError(KEY, f"{path} does not hold a JSON object")
    return conf


def _hf_families() -> list[FamilySpec]:
    return [s for s in map(family, FAMILIES) if s.hf]


def _source_family(keys, hf_conf: dict | None, where: Path | str, model_cfg) -> FamilySpec | None:
    """The family whose Hugging Face names the files hold (config.json's model_type says, else the names), or
    None for llmtrain names."""
    if hf_conf is not None and "model_type" in hf_conf:
        spec = family_for_hf_type(hf_conf["model_type"])
        if spec is None or not spec.hf:
            known = ", ".join(t for s in _hf_families() for t in s.hf_model_types)
            raise ConfigError(KEY, f"{_child(where, HF_CONFIG_FILE)}: model_type {hf_conf['model_type']!r} is not one "
                                   f"llmtrain reads ({known})")
        return spec
    if hf_conf is None and any(clean_name(k) == EMBED for k in keys):
        return None
    # Families may share names (Llama-like ones): the configured family first among those that recognize them.
    found = [s for s in _hf_families() if s.hf_adapter().is_state(keys)]
    if found:
        own = family_of(model_cfg)
        return own if own in found else found[0]
    titles = ", ".join(s.title for s in _hf_families())
    raise ConfigError(KEY, f"{where}: neither llmtrain names ({EMBED}) nor the Hugging Face names of a family "
                           f"llmtrain reads ({titles}) found")


def configured_pretrained(model_cfg) -> Pretrained | None:
    """model.init_from's weights, checked and ready to be read one tensor at a time; None without init_from."""
    return inspect_pretrained(model_cfg.init_from, model_cfg) if model_cfg.init_from else None


def inspect_pretrained(path: str | os.PathLike, model_cfg) -> Pretrained:
    """Check `model.init_from=path` against the model `model_cfg` builds, reading no tensor data from safetensors
    files: every tensor present with its shape (the vocabulary may be the real or the padded one; a position table
    may be longer than model.seq_len; a stacked parameter has every row), nothing unexpected, and for a Hugging Face
    folder its config.json agrees with what shapes cannot tell. The first difference is a ConfigError naming it.
    `path` may be an object-store URI: a store's failure (no bucket, no access) is one ConfigError line too."""
    given = os.fspath(path)
    if not is_uri(given):
        return _inspect(Path(os.path.expanduser(given)), model_cfg)
    from llmtrain.checkpoint.storage.probe import describe
    from llmtrain.errors import LlmtrainError

    try:
        return _inspect(given.rstrip("/"), model_cfg)
    except LlmtrainError:
        raise
    except Exception as e:  # noqa: BLE001 - the store client's failures, in one line naming the location
        raise ConfigError(KEY, f"{given}: {describe(e)}") from None


def _inspect(p: Path | str, model_cfg) -> Pretrained:
    """inspect_pretrained of a local path (Path) or a URI (str)."""
    if isinstance(p, Path):
        exists, is_dir = p.exists(), p.is_dir()
    else:
        is_dir = storage_for(p).isdir(p)
        exists = is_dir or storage_for(p).isfile(p)
    if not exists:
        raise ConfigError(KEY, f"no such file or folder: {p}")
    hf_conf, kept, checkpoint = None, {}, False
    if is_dir:
        if _is_file(_child(p, HF_CONFIG_FILE)):
            hf_conf = _read_hf_config(p)
            files = _hf_weight_files(p)
        elif _is_file(_child(p, SAFETENSORS_FILE)):
            files = [_child(p, SAFETENSORS_FILE)]
        elif _is_file(_child(p, DCP_METADATA)):
            files, checkpoint = [p], True
        else:
            raise ConfigError(KEY, f"{p} is neither a Hugging Face folder ({HF_CONFIG_FILE}), an llmtrain export "
                                   f"({SAFETENSORS_FILE}) nor a checkpoint folder ({DCP_METADATA})")
    else:
        files = [p]
    stored: dict[str, Stored] = {}
    for f in files:
        stored.update(_checkpoint_entries(f) if checkpoint else _file_entries(f, kept))
    src = Pretrained(p, _source_family(stored, hf_conf, p, model_cfg), files, stored, kept=kept,
                     checkpoint=checkpoint)

    own = family_of(model_cfg)
    if src.spec is not None and src.spec is not own:
        raise ConfigError(KEY, f"{p} holds a {src.format_name} model but {own.setting}; set "
                               f"{src.spec.setting} (and its sizes)")
    if checkpoint:
        _check_checkpoint_family(p, own)
    src.expected_shapes, buffers = state_shapes(model_cfg)
    src.pieces = match_pieces(src, model_cfg, own, not_loaded=set(buffers))
    if hf_conf is not None:
        own.hf_adapter().check_hf_config(hf_conf, _child(p, HF_CONFIG_FILE), model_cfg)
    return src


def _check_checkpoint_family(p: Path | str, own: FamilySpec) -> None:
    """A checkpoint of another family is refused by its config.yaml's model.arch, before any tensor name is."""
    from llmtrain.checkpoint.export import load_checkpoint_config

    try:
        saved = family_of(load_checkpoint_config(str(p)).model)
    except ConfigError:
        return  # no readable config.yaml: the tensors' names and shapes are checked all the same
    if saved is not own:
        raise ConfigError(KEY, f"{p} is a checkpoint of {saved.setting} but {own.setting}; set {saved.setting} "
                               "(and its sizes)")


def load_pretrained(path: str | os.PathLike, model_cfg) -> dict[str, torch.Tensor]:
    """Weights for `model.init_from=PATH`: full fp32 tensors with llmtrain names, checked against `model_cfg`."""
    return inspect_pretrained(path, model_cfg).load()
