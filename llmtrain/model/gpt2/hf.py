"""llmtrain's GPT <-> Hugging Face GPT2LMHeadModel: names, layout and config.json.

They differ only in names and layout: q, k and v are one Conv1D (c_attn) whose weight is (in, out), so every
linear weight is transposed, and Hugging Face's vocabulary is the real one (no padding rows).
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import torch

from llmtrain.model.weight_pieces import EMBED, POS, Piece
from llmtrain.config import ConfigError
from llmtrain.config.derived import ffn_dim

ARCHITECTURE = "GPT2LMHeadModel"
# Activations of HF GPT-2 that are the tanh approximation llmtrain's GPT uses.
_TANH_GELUS = ("gelu_new", "gelu_pytorch_tanh")
# Stored names that carry no weights: old checkpoints' causal-mask buffers, and the head tied to wte.
_IGNORED = re.compile(r"^(h\.\d+\.attn\.(bias|masked_bias)|lm_head\.weight)$")
_RENAMES = {"wte.weight": EMBED, "wpe.weight": POS, "ln_f.weight": "norm.weight", "ln_f.bias": "norm.bias"}
# Inside h.{i}.: HF name -> (llmtrain name inside layers.{i}., transposed)
_LAYER = {"ln_1.weight": ("ln_1.weight", False), "ln_1.bias": ("ln_1.bias", False),
          "ln_2.weight": ("ln_2.weight", False), "ln_2.bias": ("ln_2.bias", False),
          "attn.c_proj.weight": ("attn.proj.weight", True), "attn.c_proj.bias": ("attn.proj.bias", False),
          "mlp.c_fc.weight": ("mlp.fc.weight", True), "mlp.c_fc.bias": ("mlp.fc.bias", False),
          "mlp.c_proj.weight": ("mlp.proj.weight", True), "mlp.c_proj.bias": ("mlp.proj.bias", False)}


def check_exportable(model_cfg) -> None:
    """ConfigError unless a Hugging Face GPT-2 can hold this model: its attention width n_heads x head_dim must
    equal d_model (GPT-2 has no separate head_dim). Reads the config only; `--format hf` checks it first."""
    head_dim = model_cfg.head_dim or model_cfg.d_model // model_cfg.n_heads
    if head_dim * model_cfg.n_heads != model_cfg.d_model:
        raise ConfigError("--format", f"Hugging Face GPT-2 needs n_heads x head_dim = d_model, but this model has "
                                      f"{model_cfg.n_heads} x {head_dim} = {model_cfg.n_heads * head_dim} != "
                                      f"d_model {model_cfg.d_model}; use --format safetensors")


def to_hf_state(tensors: dict[str, torch.Tensor], model_cfg) -> dict[str, torch.Tensor]:
    """llmtrain names -> HF GPT2LMHeadModel names (Conv1D weights are (in, out)); embedding cut to vocab_size."""
    out = {"transformer.wte.weight": tensors[EMBED][:model_cfg.vocab_size].contiguous(),
           "transformer.wpe.weight": tensors[POS]}
    for i in range(model_cfg.n_layers):
        src, dst = f"layers.{i}.", f"transformer.h.{i}."
        a = src + "attn."
        out[dst + "attn.c_attn.weight"] = torch.cat([tensors[a + p + ".weight"] for p in "qkv"], 0).t().contiguous()
        out[dst + "attn.c_attn.bias"] = torch.cat([tensors[a + p + ".bias"] for p in "qkv"], 0)
        for hf, (ours, transpose) in _LAYER.items():
            t = tensors[src + ours]
            out[dst + hf] = t.t().contiguous() if transpose else t
    out["transformer.ln_f.weight"] = tensors["norm.weight"]
    out["transformer.ln_f.bias"] = tensors["norm.bias"]
    return out


def pieces(key: str) -> list[Piece] | None:
    """Where the stored tensor `key` (HF GPT-2 name, with or without "transformer.") goes: its Pieces, [] for a
    tensor without weights, None for a name GPT-2 does not have."""
    short = key[len("transformer."):] if key.startswith("transformer.") else key
    if _IGNORED.match(short):
        return []
    if short in _RENAMES:
        return [Piece(_RENAMES[short], key)]
    m = re.match(r"^h\.(\d+)\.(.+)$", short)
    if m is None:
        return None
    layer, rest = f"layers.{m.group(1)}.", m.group(2)
    if rest in ("attn.c_attn.weight", "attn.c_attn.bias"):
        kind = rest.rsplit(".", 1)[1]
        return [Piece(f"{layer}attn.{p}.{kind}", key, transpose=kind == "weight", part=i, parts=3)
                for i, p in enumerate("qkv")]
    if rest in _LAYER:
        ours, transpose = _LAYER[rest]
        return [Piece(layer + ours, key, transpose=transpose)]
    return None


def is_state(keys) -> bool:
    """Whether a weights file without config.json has GPT-2's names."""
    return any(k in ("transformer.wte.weight", "wte.weight") for k in keys)


def hf_config(model_cfg) -> dict:
    """config.json of a Hugging Face GPT2LMHeadModel equal to llmtrain's GPT for `model_cfg`."""
    d = model_cfg.d_model
    v = model_cfg.vocab_size
    return {
        "model_type": "gpt2",
        "architectures": [ARCHITECTURE],
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


def check_hf_config(conf: dict, path: Path, model_cfg) -> None:
    """What the tensors' shapes cannot tell: the depth and head count, the activation, the attention scaling, the
    LayerNorm epsilon."""
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
    eps = conf.get("layer_norm_epsilon", 1e-5)
    if not math.isclose(eps, model_cfg.norm_eps, rel_tol=1e-9):
        raise ConfigError("model.init_from", f"{path}: layer_norm_epsilon={eps} but model.norm_eps="
                                             f"{model_cfg.norm_eps}; set model.norm_eps={eps}")
