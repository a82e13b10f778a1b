"""model.init_from: weights from a Hugging Face GPT-2 or Llama folder, or an llmtrain safetensors export.

`inspect_pretrained` reads only what the files say about themselves (safetensors headers, config.json, an index)
and checks every tensor's name and shape against the model the config builds: the launcher calls it before
anything starts, so a wrong folder is one line naming the tensor, the file and both shapes. The workers then read
each parameter's full fp32 tensor by its llmtrain name (`source[name]`, one at a time; init keeps the rank's
shards of it), or all of them at once (`load`).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch

from llmtrain.checkpoint import hf_gpt2
from llmtrain.checkpoint.safetensors_io import open_safetensors, read_safetensors_header
from llmtrain.checkpoint.weight_map import EMBED, HEAD, POS, Piece, clean_name, model_shapes, shape_key
from llmtrain.config import ConfigError
from llmtrain.config.derived import padded_vocab_size

KEY = "model.init_from"
SAFETENSORS_FILE = "model.safetensors"
HF_CONFIG_FILE = "config.json"
HF_BIN_FILE = "pytorch_model.bin"
HF_INDEX_FILE = "model.safetensors.index.json"
FORMAT_NAMES = {"hf-gpt2": "HF GPT-2", "hf-llama": "HF Llama", "llmtrain": "llmtrain safetensors"}
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
    format: str  # a key of FORMAT_NAMES
    files: list[Path]
    stored: dict[str, Stored]  # by stored name
    pieces: dict[str, Piece] = field(default_factory=dict)  # by llmtrain name, once checked
    expected_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)  # of the model the config builds

    def describe(self) -> str:
        """The rank-0 log line: what was loaded from where."""
        count = sum(math.prod(p.shape(self.stored[p.key].shape)) for p in self.pieces.values())
        files = f", {len(self.files)} files" if len(self.files) > 1 else ""
        return (f"{KEY}: loaded {len(self.pieces)} tensors ({count:,} parameters) from {self.path} "
                f"({FORMAT_NAMES[self.format]}{files})")

    def __getitem__(self, name: str) -> torch.Tensor:
        """One parameter's full fp32 tensor, read on its own from the memory-mapped file: a rank initializing its
        shards holds one full tensor at a time, not the whole model (32 GB in fp32 for an 8B)."""
        piece = self.pieces[name]
        stored = self.stored[piece.key]
        if stored.tensor is None:
            with open_safetensors(stored.file) as f:
                return _fit(name, piece.take(f.get_tensor(piece.key)), self.expected_shapes[name])
        return _fit(name, piece.take(stored.tensor), self.expected_shapes[name])

    def __iter__(self) -> Iterator[str]:
        return iter(self.pieces)

    def __len__(self) -> int:
        return len(self.pieces)

    def load(self) -> dict[str, torch.Tensor]:
        """Full fp32 tensors with llmtrain names; the embedding (and an untied head) gets zero rows up to the
        padded vocabulary, a longer position table keeps its first seq_len rows."""
        out: dict[str, torch.Tensor] = {}
        by_file: dict[Path, list[Piece]] = {}
        for piece in self.pieces.values():
            by_file.setdefault(self.stored[piece.key].file, []).append(piece)
        for path, pieces in by_file.items():
            handle = open_safetensors(path) if path.suffix == ".safetensors" else None
            with handle if handle is not None else contextlib.nullcontext():
                raw: dict[str, torch.Tensor] = {}  # each stored tensor read once (GPT-2's c_attn feeds q, k, v)
                for piece in pieces:
                    if piece.key not in raw:
                        stored = self.stored[piece.key]
                        raw[piece.key] = stored.tensor if stored.tensor is not None else handle.get_tensor(piece.key)
                    out[piece.name] = _fit(piece.name, piece.take(raw[piece.key]), self.expected_shapes[piece.name])
        return {n: out[n] for n in self.expected_shapes}


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


def _format_of(keys, hf_conf: dict | None, where: Path) -> str:
    if hf_conf is not None:
        model_type = hf_conf.get("model_type", "gpt2")
        if model_type not in ("gpt2", "llama"):
            raise ConfigError(KEY, f"{where / HF_CONFIG_FILE}: model_type {model_type!r} is neither gpt2 nor llama")
        return f"hf-{model_type}"
    if any(clean_name(k) == EMBED for k in keys):
        return "llmtrain"
    if hf_gpt2.is_gpt2_state(keys):
        return "hf-gpt2"
    if "model.embed_tokens.weight" in keys:
        return "hf-llama"
    raise ConfigError(KEY, f"{where}: neither llmtrain names ({EMBED}) nor Hugging Face GPT-2 "
                           f"(transformer.wte.weight) or Llama (model.embed_tokens.weight) names found")


def _pieces_of(fmt: str, key: str) -> list[Piece] | None:
    if fmt == "llmtrain":
        return [Piece(clean_name(key), key)]
    if fmt == "hf-gpt2":
        return hf_gpt2.pieces(key)
    from llmtrain.checkpoint.hf_llama import pieces

    return pieces(key)


def configured_pretrained(model_cfg) -> Pretrained | None:
    """model.init_from's weights, checked and ready to be read one tensor at a time; None without init_from."""
    return inspect_pretrained(model_cfg.init_from, model_cfg) if model_cfg.init_from else None


def inspect_pretrained(path: str | os.PathLike, model_cfg) -> Pretrained:
    """Check `model.init_from=path` against the model `model_cfg` builds, reading no tensor data from safetensors
    files: every tensor present with its shape (the vocabulary may be the real or the padded one; a position table
    may be longer than model.seq_len), nothing unexpected, and for a Hugging Face folder its config.json agrees
    with what shapes cannot tell. The first difference is a ConfigError naming it."""
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
    src = Pretrained(p, _format_of(stored, hf_conf, p), files, stored)

    arch = getattr(model_cfg, "arch", "gpt2")
    src_arch = {"hf-gpt2": "gpt2", "hf-llama": "llama"}.get(src.format)
    if src_arch is not None and src_arch != arch:
        raise ConfigError(KEY, f"{p} holds a {FORMAT_NAMES[src.format]} model but model.arch={arch}; set "
                               f"model.arch={src_arch} (and its sizes)")
    src.expected_shapes = expected = model_shapes(model_cfg)
    _match(src, expected, model_cfg, arch)
    if hf_conf is not None:
        conf_path = p / HF_CONFIG_FILE
        if src.format == "hf-gpt2":
            hf_gpt2.check_hf_config(hf_conf, conf_path, model_cfg)
        else:
            from llmtrain.checkpoint.hf_llama import check_hf_config

            check_hf_config(hf_conf, conf_path, model_cfg)
    return src


def _match(src: Pretrained, expected: dict[str, tuple[int, ...]], model_cfg, arch: str) -> None:
    pieces: dict[str, Piece] = {}
    for key in src.stored:
        found = _pieces_of(src.format, key)
        if found is None:
            raise ConfigError(KEY, f"unexpected tensor {key} in {src.stored[key].file} (not a "
                                   f"{FORMAT_NAMES[src.format]} name)")
        for piece in found:
            pieces.setdefault(piece.name, piece)
    if HEAD not in expected:
        pieces.pop(HEAD, None)  # a tied head is the embedding: a stored copy is not used
    vocab, padded = model_cfg.vocab_size, padded_vocab_size(model_cfg)
    for name, shape in expected.items():
        if name not in pieces:
            hint = " (the file's model ties its head: set model.tie_embeddings=true)" if name == HEAD else ""
            raise ConfigError(KEY, f"missing tensor {name} in {src.path}{hint}")
        piece, stored = pieces[name], src.stored[pieces[name].key]
        got = piece.shape(stored.shape)
        if name in (EMBED, HEAD) and got[1:] == shape[1:] and got[0] in (vocab, padded):
            pass  # the real vocabulary (Hugging Face) or the padded one
        elif name == POS and got[1:] == shape[1:] and got[0] > shape[0]:
            pass  # a longer position table: its first seq_len rows are used
        elif got != shape:
            want = (vocab, *shape[1:]) if name in (EMBED, HEAD) else shape
            dim = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), 0)
            raise ConfigError(KEY, f"{name} is {list(got)} in {stored.file} but the config builds {list(want)} "
                                   f"({shape_key(name, dim, arch)})")
        if not stored.floating:
            raise ConfigError(KEY, f"{name} in {stored.file} is not a floating-point tensor")
    unexpected = [n for n in pieces if n not in expected]
    if unexpected:
        name = unexpected[0]
        raise ConfigError(KEY, f"unexpected tensor {pieces[name].key} in {src.stored[pieces[name].key].file} "
                               f"(does model.n_layers match?)")
    src.pieces = {n: pieces[n] for n in expected}


def load_pretrained(path: str | os.PathLike, model_cfg) -> dict[str, torch.Tensor]:
    """Weights for `model.init_from=PATH`: full fp32 tensors with llmtrain names, checked against `model_cfg`."""
    return inspect_pretrained(path, model_cfg).load()
