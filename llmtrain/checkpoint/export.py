"""Export a DCP checkpoint to safetensors or a Hugging Face GPT-2 folder, and load such files back as weights.

A checkpoint folder (CKPT/) holds the DCP files, the run's config.yaml and meta.json; its model tensors are stored
under "model.<parameter name>" whatever the parallel layout was, so one process without a process group can read
them back as full (consolidated) tensors. Weights files are written and read with the `safetensors` package.

Hugging Face GPT-2 differs from llmtrain's GPT only in names and layout: q, k and v are one Conv1D (c_attn) whose
weight is (in, out), so every linear weight is transposed, and its vocabulary is the real one (no padding rows).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import warnings
from pathlib import Path

import torch
from omegaconf import DictConfig
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from llmtrain.config import ConfigError, load_run_config, to_yaml
from llmtrain.config.derived import ffn_dim, padded_vocab_size

FORMATS = ("safetensors", "hf")
MODEL_PREFIX = "model."
CONFIG_FILE = "config.yaml"
METADATA_FILE = ".metadata"
SAFETENSORS_FILE = "model.safetensors"
HF_CONFIG_FILE = "config.json"
HF_BIN_FILE = "pytorch_model.bin"
HF_INDEX_FILE = "model.safetensors.index.json"
EMBED = "embed.tok.weight"
POS = "embed.pos.weight"
# Wrapper prefixes that may appear inside a parameter name (activation checkpointing, torch.compile).
_WRAPPER_PREFIXES = ("_checkpoint_wrapped_module.", "_orig_mod.")
# Activations of HF GPT-2 that are the tanh approximation llmtrain's GPT uses.
_TANH_GELUS = ("gelu_new", "gelu_pytorch_tanh")

# ---- safetensors ---------------------------------------------------------------------------------------------


def _umask() -> int:
    """The process umask, read without changing it (os.umask would race with other threads)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o022


def _dense_unshared(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`tensors` as safetensors takes them: contiguous CPU tensors, none sharing its storage with another."""
    out, storages = {}, set()
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: not a tensor ({type(t).__name__})")
        t = t.detach().to("cpu").contiguous()
        if t.numel() and t.untyped_storage().data_ptr() in storages:
            t = t.clone()  # a copy only where needed: an export can be most of the host's memory
        storages.add(t.untyped_storage().data_ptr())
        out[name] = t
    return out


def write_safetensors(tensors: dict[str, torch.Tensor], path: str | os.PathLike,
                      metadata: dict[str, str] | None = None) -> None:
    """Write `tensors` to `path` in the safetensors format, atomically (temp file in the same folder + rename)."""
    path = Path(path)
    tensors = _dense_unshared(tensors)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        save_file(tensors, tmp, metadata=metadata)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes it 0600
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _open_safetensors(path: Path):
    """safe_open(path); a missing, unreadable or malformed file is a ConfigError naming it."""
    try:
        return safe_open(str(path), framework="pt")
    except OSError as e:
        raise ConfigError(str(path), f"cannot read: {e.strerror or e}") from None
    except SafetensorError as e:
        raise ConfigError(str(path), f"not a valid safetensors file: {e}") from None


def read_safetensors_metadata(path: str | os.PathLike) -> dict[str, str]:
    """The `__metadata__` entry of a safetensors file ({} if none)."""
    with _open_safetensors(Path(path)) as f:
        return dict(f.metadata() or {})


def read_safetensors(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """All tensors of a safetensors file, on the CPU; a malformed file is a ConfigError naming it."""
    with _open_safetensors(Path(path)) as f:  # safe_open has checked the header against the file size
        return {name: f.get_tensor(name) for name in f.keys()}


# ---- reading a DCP checkpoint --------------------------------------------------------------------------------


def _clean_name(name: str) -> str:
    for prefix in _WRAPPER_PREFIXES:
        name = name.replace(prefix, "")
    return name


def load_checkpoint_config(ckpt_dir: str | os.PathLike) -> DictConfig:
    """The run config saved with a checkpoint; ConfigError for a missing folder or config.yaml."""
    ckpt = Path(ckpt_dir)
    if not ckpt.exists():
        raise ConfigError(str(ckpt), "no such checkpoint folder")
    if not ckpt.is_dir():
        raise ConfigError(str(ckpt), "not a checkpoint folder (expected a folder with DCP files and config.yaml)")
    cfg_path = ckpt / CONFIG_FILE
    if not cfg_path.is_file():
        raise ConfigError(str(cfg_path), "missing: a checkpoint folder holds the run's config.yaml next to its "
                                         "DCP files (is this a complete checkpoint folder?)")
    return load_run_config(cfg_path)


def _read_dcp_metadata(ckpt: Path):
    from torch.distributed.checkpoint import FileSystemReader

    meta_path = ckpt / METADATA_FILE
    if not meta_path.is_file():
        raise ConfigError(str(meta_path), "missing: not a torch.distributed.checkpoint folder, or an incomplete one")
    try:
        return FileSystemReader(str(ckpt)).read_metadata()
    except Exception as e:  # truncated pickle, garbage, wrong version, ...
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(str(meta_path), f"unreadable or corrupt DCP metadata ({type(e).__name__}: {msg})") from None


def load_model_state(ckpt_dir: str | os.PathLike) -> tuple[dict[str, torch.Tensor], DictConfig]:
    """Full fp32 model tensors of a DCP checkpoint with llmtrain names (no "model." prefix), and its run config.

    Runs in one process without a process group; DCP reassembles whatever shards the run's layout wrote. The
    head is tied to the embedding, so only embed.tok.weight is returned (a stored head.weight is dropped).
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    from llmtrain.model.gpt import GPT, GPTArgs

    ckpt = Path(ckpt_dir)
    cfg = load_checkpoint_config(ckpt)
    metadata = _read_dcp_metadata(ckpt)

    stored: dict[str, tuple[str, TensorStorageMetadata]] = {}  # clean name -> (stored key, metadata)
    for key, md in metadata.state_dict_metadata.items():
        if key.startswith(MODEL_PREFIX) and isinstance(md, TensorStorageMetadata):
            stored.setdefault(_clean_name(key[len(MODEL_PREFIX):]), (key[len(MODEL_PREFIX):], md))
    if not stored:
        raise ConfigError(str(ckpt / METADATA_FILE), "no model tensors in this checkpoint (no 'model.*' keys)")

    with torch.device("meta"):
        expected = {n: tuple(p.shape) for n, p in GPT(GPTArgs.from_config(cfg.model)).named_parameters()}
    for name, shape in expected.items():
        if name not in stored:
            raise ConfigError(str(ckpt), f"model tensor {name} is missing from the checkpoint")
        got = tuple(stored[name][1].size)
        if got != shape:
            raise ConfigError(str(ckpt), f"shape mismatch for {name}: checkpoint {got} vs its config.yaml {shape}")

    request = {stored[n][0]: torch.empty(tuple(stored[n][1].size), dtype=stored[n][1].properties.dtype)
               for n in expected}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "assuming the intent is to load in a single process"
            dcp.load({"model": request}, checkpoint_id=str(ckpt), no_dist=True)
    except Exception as e:
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(str(ckpt), f"cannot read the DCP shard files ({type(e).__name__}: {msg[:500]})") from None
    tensors = {n: request[stored[n][0]] for n in expected}
    return {n: (t.float() if t.is_floating_point() else t) for n, t in tensors.items()}, cfg


def _read_meta_json(ckpt: Path) -> dict:
    try:
        meta = json.loads((ckpt / "meta.json").read_text())
        return meta if isinstance(meta, dict) else {}
    except (OSError, ValueError):
        return {}


# ---- llmtrain <-> Hugging Face GPT-2 -------------------------------------------------------------------------


def check_hf_exportable(model_cfg) -> None:
    """ConfigError unless a Hugging Face GPT-2 can hold this model: its attention width n_heads x head_dim must
    equal d_model (GPT-2 has no separate head_dim). Reads the config only; `--format hf` checks it first."""
    head_dim = model_cfg.head_dim or model_cfg.d_model // model_cfg.n_heads
    if head_dim * model_cfg.n_heads != model_cfg.d_model:
        raise ConfigError("--format", f"Hugging Face GPT-2 needs n_heads x head_dim = d_model, but this model has "
                                      f"{model_cfg.n_heads} x {head_dim} = {model_cfg.n_heads * head_dim} != "
                                      f"d_model {model_cfg.d_model}; use --format safetensors")


def to_hf_state(tensors: dict[str, torch.Tensor], n_layers: int, vocab_size: int) -> dict[str, torch.Tensor]:
    """llmtrain names -> HF GPT2LMHeadModel names (Conv1D weights are (in, out)); embedding cut to vocab_size."""
    out = {"transformer.wte.weight": tensors[EMBED][:vocab_size].contiguous(),
           "transformer.wpe.weight": tensors[POS]}
    for i in range(n_layers):
        src, dst = f"layers.{i}.", f"transformer.h.{i}."
        a = src + "attn."
        for ln in ("ln_1", "ln_2"):
            out[f"{dst}{ln}.weight"] = tensors[f"{src}{ln}.weight"]
            out[f"{dst}{ln}.bias"] = tensors[f"{src}{ln}.bias"]
        out[dst + "attn.c_attn.weight"] = torch.cat([tensors[a + p + ".weight"] for p in "qkv"], 0).t().contiguous()
        out[dst + "attn.c_attn.bias"] = torch.cat([tensors[a + p + ".bias"] for p in "qkv"], 0)
        out[dst + "attn.c_proj.weight"] = tensors[a + "proj.weight"].t().contiguous()
        out[dst + "attn.c_proj.bias"] = tensors[a + "proj.bias"]
        for hf, ours in (("c_fc", "fc"), ("c_proj", "proj")):
            out[f"{dst}mlp.{hf}.weight"] = tensors[f"{src}mlp.{ours}.weight"].t().contiguous()
            out[f"{dst}mlp.{hf}.bias"] = tensors[f"{src}mlp.{ours}.bias"]
    out["transformer.ln_f.weight"] = tensors["norm.weight"]
    out["transformer.ln_f.bias"] = tensors["norm.bias"]
    return out


def _from_hf_state(hf: dict[str, torch.Tensor], n_layers: int) -> dict[str, torch.Tensor]:
    """HF GPT-2 names (with or without the "transformer." prefix) -> llmtrain names. Missing tensors are left out
    (the caller reports them); the causal-mask buffers and the tied lm_head of old checkpoints are ignored."""
    hf = {(k[len("transformer."):] if k.startswith("transformer.") else k): v for k, v in hf.items()}
    out: dict[str, torch.Tensor] = {}

    def put(ours: str, theirs: str, transpose: bool = False) -> None:
        if theirs in hf:
            out[ours] = hf[theirs].t() if transpose and hf[theirs].dim() == 2 else hf[theirs]

    put(EMBED, "wte.weight")
    put(POS, "wpe.weight")
    # Layers beyond n_layers are converted too, so the caller reports them as unexpected tensors.
    found = [int(k.split(".")[1]) for k in hf if k.startswith("h.") and k.split(".")[1].isdigit()]
    for i in range(max([n_layers - 1, *found]) + 1):
        src, dst = f"h.{i}.", f"layers.{i}."
        for ln in ("ln_1", "ln_2"):
            put(f"{dst}{ln}.weight", f"{src}{ln}.weight")
            put(f"{dst}{ln}.bias", f"{src}{ln}.bias")
        for kind in ("weight", "bias"):
            fused = hf.get(f"{src}attn.c_attn.{kind}")
            if fused is not None:
                fused = fused.t() if kind == "weight" and fused.dim() == 2 else fused
                if fused.shape[0] % 3 == 0:
                    for p, part in zip("qkv", fused.chunk(3, dim=0)):
                        out[f"{dst}attn.{p}.{kind}"] = part
                else:  # shape check will report it
                    out[f"{dst}attn.q.{kind}"] = fused
        put(f"{dst}attn.proj.weight", f"{src}attn.c_proj.weight", transpose=True)
        put(f"{dst}attn.proj.bias", f"{src}attn.c_proj.bias")
        put(f"{dst}mlp.fc.weight", f"{src}mlp.c_fc.weight", transpose=True)
        put(f"{dst}mlp.fc.bias", f"{src}mlp.c_fc.bias")
        put(f"{dst}mlp.proj.weight", f"{src}mlp.c_proj.weight", transpose=True)
        put(f"{dst}mlp.proj.bias", f"{src}mlp.c_proj.bias")
    put("norm.weight", "ln_f.weight")
    put("norm.bias", "ln_f.bias")
    return out


def hf_config(model_cfg) -> dict:
    """config.json of a Hugging Face GPT2LMHeadModel equal to llmtrain's GPT for `model_cfg`."""
    d = model_cfg.d_model
    v = model_cfg.vocab_size
    return {
        "model_type": "gpt2",
        "architectures": ["GPT2LMHeadModel"],
        "vocab_size": v,
        "n_positions": model_cfg.seq_len,
        "n_ctx": model_cfg.seq_len,
        "n_embd": d,
        "n_layer": model_cfg.n_layers,
        "n_head": model_cfg.n_heads,
        "n_inner": ffn_dim(model_cfg),
        "activation_function": "gelu_new",
        "layer_norm_epsilon": model_cfg.norm_eps,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
        "initializer_range": model_cfg.init_std,
        "scale_attn_weights": True,
        "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False,
        "tie_word_embeddings": True,
        "bos_token_id": v - 1,
        "eos_token_id": v - 1,
        "use_cache": True,
    }


# ---- export --------------------------------------------------------------------------------------------------


def _check_out_dir(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        what = "is not a folder" if not out.is_dir() else "exists and is not empty"
        raise ConfigError("--out", f"{out} {what}; choose a new or empty folder")


def export_checkpoint(ckpt_dir: str | os.PathLike, fmt: str, out_dir: str | os.PathLike) -> dict:
    """Write the checkpoint's model as `fmt` ("safetensors" or "hf") into the new folder `out_dir`.

    Everything is written into a temporary folder next to out_dir and renamed at the end, so a failure leaves
    nothing behind. Returns a summary: {"out", "format", "files", "num_params"}.
    """
    if fmt not in FORMATS:
        raise ConfigError("--format", f"unknown format {fmt!r} (choose from {', '.join(FORMATS)})")
    ckpt, out = Path(ckpt_dir), Path(out_dir)
    _check_out_dir(out)
    cfg = load_checkpoint_config(ckpt)
    if fmt == "hf":
        check_hf_exportable(cfg.model)
    tensors, cfg = load_model_state(ckpt)
    vocab = cfg.model.vocab_size
    num_params = sum(t.numel() for t in tensors.values()) - (tensors[EMBED].shape[0] - vocab) * cfg.model.d_model

    meta = {"format": "pt", "producer": "llmtrain", "source": str(ckpt.resolve())}
    run_meta = _read_meta_json(ckpt)
    if "step" in run_meta:
        meta["step"] = str(run_meta["step"])
    if fmt == "safetensors":
        st = dict(tensors)
        st[EMBED] = st[EMBED][:vocab].contiguous()
        meta.update(layout="llmtrain", vocab_size=str(vocab), padded_vocab_size=str(padded_vocab_size(cfg.model)))
        files = {SAFETENSORS_FILE: st, CONFIG_FILE: to_yaml(cfg)}
    else:
        st = to_hf_state(tensors, cfg.model.n_layers, vocab)
        meta.update(layout="hf-gpt2")
        files = {SAFETENSORS_FILE: st, HF_CONFIG_FILE: json.dumps(hf_config(cfg.model), indent=2) + "\n"}

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes it 0700
        for name, content in files.items():
            if isinstance(content, dict):
                write_safetensors(content, tmp / name, meta)
            else:
                (tmp / name).write_text(content)
        _check_out_dir(out)  # again: something may have appeared meanwhile
        if out.is_dir():
            out.rmdir()  # empty: replaced by the finished folder
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return {"out": str(out), "format": fmt, "files": sorted(files), "num_params": num_params}


# ---- init_from -----------------------------------------------------------------------------------------------


def _torch_load(path: Path) -> dict[str, torch.Tensor]:
    try:
        sd = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError("model.init_from", f"cannot read {path}: {msg[:300]}") from None
    if isinstance(sd, dict) and isinstance(sd.get("state_dict"), dict):
        sd = sd["state_dict"]
    if not isinstance(sd, dict):
        raise ConfigError("model.init_from", f"{path} does not hold a dict of tensors")
    return {k: v for k, v in sd.items() if isinstance(v, torch.Tensor)}


def _read_weights_file(path: Path) -> dict[str, torch.Tensor]:
    if path.suffix == ".safetensors":
        return read_safetensors(path)
    return _torch_load(path)


def _read_hf_folder(folder: Path) -> dict[str, torch.Tensor]:
    if (folder / SAFETENSORS_FILE).is_file():
        return read_safetensors(folder / SAFETENSORS_FILE)
    if (folder / HF_INDEX_FILE).is_file():  # sharded: model-00001-of-0000N.safetensors
        try:
            weight_map = json.loads((folder / HF_INDEX_FILE).read_text())["weight_map"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ConfigError("model.init_from", f"unreadable {folder / HF_INDEX_FILE}: {e}") from None
        out: dict[str, torch.Tensor] = {}
        for shard in sorted(set(weight_map.values())):
            out.update(read_safetensors(folder / shard))
        return out
    if (folder / HF_BIN_FILE).is_file():
        return _torch_load(folder / HF_BIN_FILE)
    raise ConfigError("model.init_from", f"{folder} has no {SAFETENSORS_FILE}, {HF_INDEX_FILE} or {HF_BIN_FILE}")


def _check_hf_config(folder: Path, model_cfg) -> None:
    path = folder / HF_CONFIG_FILE
    try:
        conf = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ConfigError("model.init_from", f"unreadable {path}: {e}") from None
    if conf.get("model_type", "gpt2") != "gpt2":
        raise ConfigError("model.init_from", f"{path}: model_type {conf.get('model_type')!r} is not gpt2")
    for hf_key, ours in (("n_layer", "n_layers"), ("n_head", "n_heads"), ("n_embd", "d_model")):
        if hf_key in conf and conf[hf_key] != getattr(model_cfg, ours):
            raise ConfigError("model.init_from", f"{path}: {hf_key}={conf[hf_key]} but model.{ours}="
                                                 f"{getattr(model_cfg, ours)}")
    act = conf.get("activation_function", "gelu_new")
    if act not in _TANH_GELUS:
        raise ConfigError("model.init_from", f"{path}: activation_function {act!r} is not the tanh GELU "
                                             f"({' / '.join(_TANH_GELUS)}) llmtrain's GPT uses")
    if conf.get("scale_attn_by_inverse_layer_idx") or conf.get("scale_attn_weights", True) is False:
        raise ConfigError("model.init_from", f"{path}: non-standard attention scaling is not supported")


def load_pretrained(path: str | os.PathLike, model_cfg) -> dict[str, torch.Tensor]:
    """Weights for `model.init_from=PATH`: full fp32 tensors with llmtrain names, checked against `model_cfg`.

    PATH is a Hugging Face GPT-2 folder (config.json + model.safetensors, sharded safetensors or
    pytorch_model.bin), an llmtrain safetensors export folder, or a single .safetensors / .bin / .pt file of
    either naming. The embedding gets zero rows up to the padded vocabulary; a position table longer than
    model.seq_len keeps its first seq_len rows. Any other difference is a ConfigError naming the first tensor.
    """
    from llmtrain.model.gpt import GPT, GPTArgs

    p = Path(path)
    if not p.exists():
        raise ConfigError("model.init_from", f"no such file or folder: {p}")
    if p.is_dir():
        if (p / HF_CONFIG_FILE).is_file():
            _check_hf_config(p, model_cfg)
            raw = _read_hf_folder(p)
        elif (p / SAFETENSORS_FILE).is_file():
            raw = read_safetensors(p / SAFETENSORS_FILE)
        else:
            raise ConfigError("model.init_from", f"{p} is neither a Hugging Face GPT-2 folder ({HF_CONFIG_FILE}) "
                                                 f"nor an llmtrain export ({SAFETENSORS_FILE})")
    else:
        raw = _read_weights_file(p)

    if EMBED in raw or any(_clean_name(k) == EMBED for k in raw):
        tensors = {_clean_name(k): v for k, v in raw.items()}
        tensors.pop("head.weight", None)  # tied to the embedding
    elif any(k in raw for k in ("transformer.wte.weight", "wte.weight")):
        tensors = _from_hf_state(raw, model_cfg.n_layers)
    else:
        raise ConfigError("model.init_from", f"{p}: neither llmtrain names ({EMBED}) nor Hugging Face GPT-2 names "
                                             f"(transformer.wte.weight) found")

    padded, vocab = padded_vocab_size(model_cfg), model_cfg.vocab_size
    with torch.device("meta"):
        expected = {n: tuple(q.shape) for n, q in GPT(GPTArgs.from_config(model_cfg)).named_parameters()}
    out: dict[str, torch.Tensor] = {}
    for name, shape in expected.items():
        if name not in tensors:
            raise ConfigError("model.init_from", f"missing tensor {name} in {p}")
        t = tensors[name]
        got = tuple(t.shape)
        if name == EMBED and len(got) == 2 and got[1] == shape[1] and got[0] in (vocab, padded):
            t = torch.cat([t, t.new_zeros(padded - got[0], shape[1])]) if got[0] < padded else t
        elif name == POS and len(got) == 2 and got[1] == shape[1] and got[0] > shape[0]:
            t = t[: shape[0]]
        elif got != shape:
            want = (vocab, shape[1]) if name == EMBED else shape
            raise ConfigError("model.init_from", f"shape mismatch for {name}: checkpoint {got} vs config {want}")
        if not t.is_floating_point():
            raise ConfigError("model.init_from", f"{name} in {p} has dtype {t.dtype}, not a floating-point type")
        out[name] = t.to(torch.float32).contiguous().clone()
    unexpected = [k for k in tensors if k not in expected]
    if unexpected:
        raise ConfigError("model.init_from", f"unexpected tensor {unexpected[0]} in {p} (does model.n_layers match?)")
    return out
