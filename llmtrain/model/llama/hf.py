"""llmtrain's Llama <-> Hugging Face LlamaForCausalLM: names and config.json.

The weights need no reshaping: both keep linear weights as (out, in), and llmtrain's rotary embedding uses the
"rotate_half" layout and inverse frequencies of transformers' Llama, so q and k map with no permutation. Only
the vocabulary differs: Hugging Face's is the real one (no padding rows).
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import torch

from llmtrain.model.weight_pieces import EMBED, HEAD, Piece
from llmtrain.config import ConfigError
from llmtrain.config.derived import ffn_dim, head_dim, kv_heads

ARCHITECTURE = "LlamaForCausalLM"
_TOP = {"model.embed_tokens.weight": EMBED, "model.norm.weight": "norm.weight", "lm_head.weight": HEAD}
# Inside model.layers.{i}. (HF) and layers.{i}. (llmtrain).
_LAYER = {"input_layernorm.weight": "ln_1.weight",
          "self_attn.q_proj.weight": "attn.q.weight",
          "self_attn.k_proj.weight": "attn.k.weight",
          "self_attn.v_proj.weight": "attn.v.weight",
          "self_attn.o_proj.weight": "attn.proj.weight",
          "post_attention_layernorm.weight": "ln_2.weight",
          "mlp.gate_proj.weight": "mlp.gate.weight",
          "mlp.up_proj.weight": "mlp.fc.weight",
          "mlp.down_proj.weight": "mlp.proj.weight"}
_TOP_BACK = {ours: hf for hf, ours in _TOP.items()}
_LAYER_BACK = {ours: hf for hf, ours in _LAYER.items()}
_LAYER_NAME = re.compile(r"^(model\.)?layers\.(\d+)\.(.+)$")


def hf_name(name: str) -> str:
    """The Hugging Face name of llmtrain parameter `name`."""
    if name in _TOP_BACK:
        return _TOP_BACK[name]
    m = _LAYER_NAME.match(name)
    if m is None or m.group(3) not in _LAYER_BACK:
        raise KeyError(f"{name} has no Hugging Face Llama name")
    return f"model.layers.{m.group(2)}.{_LAYER_BACK[m.group(3)]}"


def to_hf_state(tensors: dict[str, torch.Tensor], model_cfg) -> dict[str, torch.Tensor]:
    """llmtrain names -> HF LlamaForCausalLM names; embedding (and an untied head) cut to vocab_size."""
    vocab = model_cfg.vocab_size
    return {hf_name(n): (t[:vocab].contiguous() if n in (EMBED, HEAD) else t) for n, t in tensors.items()}


def pieces(key: str) -> list[Piece] | None:
    """Where the stored tensor `key` (HF Llama name) goes: one Piece, [] for a tensor without weights (old
    checkpoints' rotary inv_freq buffers), None for a name Llama does not have."""
    if key in _TOP:
        return [Piece(_TOP[key], key)]
    m = re.match(r"^model\.layers\.(\d+)\.(.+)$", key)
    if m is None:
        return None
    if m.group(2) == "self_attn.rotary_emb.inv_freq":
        return []
    ours = _LAYER.get(m.group(2))
    return None if ours is None else [Piece(f"layers.{m.group(1)}.{ours}", key)]


def is_state(keys) -> bool:
    """Whether a weights file without config.json has Llama's names (other families share them: the caller
    prefers the configured family among those that answer yes)."""
    return "model.embed_tokens.weight" in keys


def check_exportable(model_cfg) -> None:
    """ConfigError for a mixture-of-experts Llama: LlamaForCausalLM has no experts. Every dense one fits."""
    if getattr(model_cfg, "moe", None) is not None:
        raise ConfigError("--format", "Hugging Face Llama has no mixture-of-experts layers (model.moe is set); use "
                                      "--format safetensors")


def _rope_scaling(model_cfg) -> dict | None:
    s = model_cfg.rope_scaling
    if s is None:
        return None
    return {"rope_type": "llama3", "factor": float(s.factor), "low_freq_factor": float(s.low_freq_factor),
            "high_freq_factor": float(s.high_freq_factor),
            "original_max_position_embeddings": int(s.original_max_position_embeddings)}


def hf_config(model_cfg) -> dict:
    """config.json of a Hugging Face LlamaForCausalLM equal to llmtrain's Llama for `model_cfg`. rope_theta and
    rope_scaling are written as Meta's published folders have them, which every transformers version reads."""
    return {
        "model_type": "llama",
        "architectures": [ARCHITECTURE],
        "vocab_size": model_cfg.vocab_size,
        "hidden_size": model_cfg.d_model,
        "intermediate_size": ffn_dim(model_cfg),
        "num_hidden_layers": model_cfg.n_layers,
        "num_attention_heads": model_cfg.n_heads,
        "num_key_value_heads": kv_heads(model_cfg),
        "head_dim": head_dim(model_cfg),
        "hidden_act": "silu",
        "max_position_embeddings": model_cfg.seq_len,
        "initializer_range": model_cfg.init_std,
        "rms_norm_eps": model_cfg.norm_eps,
        "rope_theta": float(model_cfg.rope_theta),
        "rope_scaling": _rope_scaling(model_cfg),
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "tie_word_embeddings": bool(model_cfg.tie_embeddings),
        "torch_dtype": "float32",
        "use_cache": True,
    }


def _rope_of(conf: dict) -> tuple[float, dict | None]:
    """(rope_theta, llama3 scaling or None) of a config.json: transformers 5 writes them as rope_parameters,
    earlier versions and Meta's folders as rope_theta + rope_scaling."""
    params = conf.get("rope_parameters") or {}
    theta = float(params.get("rope_theta", conf.get("rope_theta", 10000.0)))
    scaling = conf.get("rope_scaling") or (params if params.get("rope_type", "default") != "default" else None)
    if scaling is None or scaling.get("rope_type", scaling.get("type", "default")) == "default":
        return theta, None
    return theta, scaling


def _differ(a: float, b: float) -> bool:
    return not math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=0.0)


def check_hf_config(conf: dict, path: Path, model_cfg) -> None:
    """What the tensors' shapes cannot tell: the head split, the norm epsilon, the rotary settings, the tied head,
    the activation. Each difference is one line naming the config.json key and the model.* key to set."""
    def refuse(what: str, fix: str) -> None:
        raise ConfigError("model.init_from", f"{path} has {what} but {fix}")

    for hf_key, ours, value in (("num_hidden_layers", "n_layers", model_cfg.n_layers),
                                ("num_attention_heads", "n_heads", model_cfg.n_heads),
                                ("num_key_value_heads", "n_kv_heads", kv_heads(model_cfg)),
                                ("head_dim", "head_dim", head_dim(model_cfg))):
        if conf.get(hf_key) is not None and conf[hf_key] != value:
            refuse(f"{hf_key}={conf[hf_key]}", f"the config builds model.{ours}={value}; set model.{ours}="
                                               f"{conf[hf_key]}")
    act = conf.get("hidden_act", "silu")
    if act != "silu":
        refuse(f"hidden_act={act!r}", "llmtrain's Llama uses SiLU (SwiGLU)")
    for bias in ("attention_bias", "mlp_bias"):
        if conf.get(bias):
            refuse(f"{bias}=true", "llmtrain's Llama has no biases")
    eps = conf.get("rms_norm_eps", 1e-6)
    if _differ(eps, model_cfg.norm_eps):
        refuse(f"rms_norm_eps={eps}", f"model.norm_eps={model_cfg.norm_eps}; set model.norm_eps={eps}")
    theta, scaling = _rope_of(conf)
    if _differ(theta, model_cfg.rope_theta):
        refuse(f"rope_theta={theta:g}", f"model.rope_theta={model_cfg.rope_theta:g}; set model.rope_theta={theta:g}")
    ours = _rope_scaling(model_cfg)
    if scaling is not None and scaling.get("rope_type", scaling.get("type")) != "llama3":
        refuse(f"rope scaling of type {scaling.get('rope_type', scaling.get('type'))!r}",
               "llmtrain implements only Llama 3.1's (rope_type llama3)")
    if (scaling is None) != (ours is None):
        what = "no rope_scaling" if scaling is None else "rope_scaling (llama3)"
        refuse(what, f"model.rope_scaling is {'set' if ours else 'null'}; make them agree")
    if scaling is not None:
        for field in ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"):
            if field in scaling and _differ(scaling[field], ours[field]):
                refuse(f"rope_scaling.{field}={scaling[field]}", f"model.rope_scaling.{field}={ours[field]}; set "
                                                                 f"model.rope_scaling.{field}={scaling[field]}")
    tied = bool(conf.get("tie_word_embeddings", False))
    if tied != bool(model_cfg.tie_embeddings):
        refuse(f"tie_word_embeddings={str(tied).lower()}", f"model.tie_embeddings={model_cfg.tie_embeddings}; set "
                                                           f"model.tie_embeddings={str(tied).lower()}")
