"""model.init_from: weights from a Hugging Face folder of a family llmtrain reads (its adapter,
model/<family>/hf.py, names and checks them), or an llmtrain safetensors export.

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
from llmtrain.checkpoint.safetensors_io import open_safetensors, read_safetensors_header
from llmtrain.checkpoint.weight_map import EMBED, HEAD, POS, Piece, clean_name, state_shapes
from llmtrain.config import ConfigError
from llmtrain.model.family import FamilySpec
from llmtrain.model.registry import FAMILIES, family, family_for_hf_type, family_of

SAFETENSORS_FILE = "model.safetensors"
HF_CONFIG_FILE = "config.json"
HF_BIN_FILE = "pytorch_model.bin"
HF_INDEX_FILE = "model.safetensors.index.json"
LLMTRAIN_FORMAT = "llmtrain"
_FLOAT_DTYPES = ("F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2")


@dataclass
class Stored:
    """One tensor of the source files, as its header (or a memory-mapped torch file) describes it."""

    file: Path
    shape: tuple[int, ...]
    floating: bool
    tensor: torch.Tensor | None = None  # torch files only: memory-mapped, read on use


@dataclass(eq=False)
class Pretrained(Mapping):
    """A checked model.init_from source: llmtrain parameter name -> its full fp32 tensor, read when asked for."""

    path: Path
    spec: FamilySpec | None  # the family whose Hugging Face names the files hold; None: llmtrain names
    files: list[Path]
    stored: dict[str, Stored]  # by stored name
    # By llmtrain name, once checked: its one Piece, or a stacked parameter's rows in slot order.
    pieces: dict[str, list[Piece]] = field(default_factory=dict)
    expected_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)  # of the model the config builds

    @property
    def format(self) -> str:
        return LLMTRAIN_FORMAT if self.spec is None else f"hf-{self.spec.name}"

    @property
    def format_name(self) -> str:
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
            read = _Reader(self.stored, opened)
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
            read = _Reader(self.stored, opened)
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
    """Reads stored tensors by name, opening each safetensors file once while `opened` lasts."""

    def __init__(self, stored: dict[str, Stored], opened: contextlib.ExitStack):
        self.stored, self.opened, self.handles = stored, opened, {}

    def __call__(self, key: str) -> torch.Tensor:
        stored = self.stored[key]
        if stored.tensor is not None:
            return stored.tensor
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


def _torch_entries(path: Path) -> dict[str, Stored]:
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


def _file_entries(path: Path) -> dict[str, Stored]:
    return _safetensors_entries(path) if path.suffix == ".safetensors" else _torch_entries(path)


def _hf_weight_files(folder: Path) -> list[Path]:
    if (folder / SAFETENSORS_FILE).is_file():
        return [folder / SAFETENSORS_FILE]
    index = folder / HF_INDEX_FILE
    if index.is_file():  # sharded: model-00001-of-0000N.safetensors
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
            shards = sorted(set(weight_map.values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise ConfigError(KEY, f"unreadable {index}: {type(e).__name__}: {e}") from None
        for shard in shards:
            if not (folder / shard).is_file():
                raise ConfigError(KEY, f"{folder / shard} (listed in {index}) is missing")
        return [folder / shard for shard in shards]
    if (folder / HF_BIN_FILE).is_file():
        return [folder / HF_BIN_FILE]
    raise ConfigError(KEY, f"{folder} has no {SAFETENSORS_FILE}, {HF_INDEX_FILE} or {HF_BIN_FILE}")


def _read_hf_config(folder: Path) -> dict:
    path = folder / HF_CONFIG_FILE
    try:
        conf = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(KEY, f"unreadable {path}: {e}") from None
    if not isinstance(conf, dict):
        raise ConfigError(KEY, f"{path} does not hold a JSON object")
    return conf


def _hf_families() -> list[FamilySpec]:
    return [s for s in map(family, FAMILIES) if s.hf]


def _source_family(keys, hf_conf: dict | None, where: Path, model_cfg) -> FamilySpec | None:
    """The family whose Hugging Face names the files hold (config.json's model_type says, else the names), or
    None for llmtrain names."""
    if hf_conf is not None and "model_type" in hf_conf:
        spec = family_for_hf_type(hf_conf["model_type"])
        if spec is None or not spec.hf:
            known = ", ".join(t for s in _hf_families() for t in s.hf_model_types)
            raise ConfigError(KEY, f"{where / HF_CONFIG_FILE}: model_type {hf_conf['model_type']!r} is not one "
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
    folder its config.json agrees with what shapes cannot tell. The first difference is a ConfigError naming it."""
    p = Path(os.path.expanduser(os.fspath(path)))
    if not p.exists():
        raise ConfigError(KEY, f"no such file or folder: {p}")
    hf_conf = None
    if p.is_dir():
        if (p / HF_CONFIG_FILE).is_file():
            hf_conf = _read_hf_config(p)
            files = _hf_weight_files(p)
        elif (p / SAFETENSORS_FILE).is_file():
            files = [p / SAFETENSORS_FILE]
        else:
            raise ConfigError(KEY, f"{p} is neither a Hugging Face folder ({HF_CONFIG_FILE}) nor an llmtrain "
                                   f"export ({SAFETENSORS_FILE})")
    else:
        files = [p]
    stored: dict[str, Stored] = {}
    for f in files:
        stored.update(_file_entries(f))
    src = Pretrained(p, _source_family(stored, hf_conf, p, model_cfg), files, stored)

    own = family_of(model_cfg)
    if src.spec is not None and src.spec is not own:
        raise ConfigError(KEY, f"{p} holds a {src.format_name} model but {own.setting}; set "
                               f"{src.spec.setting} (and its sizes)")
    src.expected_shapes, buffers = state_shapes(model_cfg)
    src.pieces = match_pieces(src, model_cfg, own, not_loaded=set(buffers))
    if hf_conf is not None:
        own.hf_adapter().check_hf_config(hf_conf, p / HF_CONFIG_FILE, model_cfg)
    return src


def load_pretrained(path: str | os.PathLike, model_cfg) -> dict[str, torch.Tensor]:
    """Weights for `model.init_from=PATH`: full fp32 tensors with llmtrain names, checked against `model_cfg`."""
    return inspect_pretrained(path, model_cfg).load()
