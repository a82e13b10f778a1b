"""llmtrain's OLMoE <-> Hugging Face OlmoeForCausalLM: names and config.json.

The names are Qwen3-MoE's (model/qwen3/hf.py: Llama's, the q/k norms, the router as `mlp.gate`, one tensor per
expert matrix); only the norms' widths differ, which the shapes carry. config.json has no head_dim (a head is
hidden_size / num_attention_heads wide) and no dense layers; intermediate_size is the experts' width.
"""

from __future__ import annotations

from pathlib import Path

from llmtrain.config import ConfigError
from llmtrain.model.family import head_width, moe_args
from llmtrain.model.llama import hf as llama_hf
from llmtrain.model.qwen3 import hf as qwen3_hf
from llmtrain.model.qwen3.hf import hf_name, pieces, to_hf_state  # noqa: F401  (the adapter protocol)

ARCHITECTURE = "OlmoeForCausalLM"


def is_state(keys) -> bool:
    """Qwen3's names with experts (a dense Qwen3 folder has none)."""
    return qwen3_hf.is_state(keys) and any(".mlp.experts." in k for k in keys)


def check_exportable(model_cfg) -> None:
    """OlmoeForCausalLM: every layer sparse, heads d_model / n_heads wide, Qwen3-MoE's routing."""
    qwen3_hf.check_exportable(model_cfg, ARCHITECTURE)
    m, args = model_cfg, moe_args(model_cfg)
    if args.n_dense_layers or args.sparse_every != 1:
        raise ConfigError("--format", f"Hugging Face {ARCHITECTURE} has every layer sparse, but this model has "
                                      f"model.moe.n_dense_layers={args.n_dense_layers} and model.moe.sparse_every="
                                      f"{args.sparse_every}; use --format safetensors")
    if m.n_heads * head_width(m) != m.d_model:
        raise ConfigError("--format", f"Hugging Face {ARCHITECTURE} needs n_heads x head_dim = d_model, but this "
                                      f"model has {m.n_heads} x {head_width(m)} != d_model {m.d_model}; use "
                                      f"--format safetensors")


def hf_config(model_cfg) -> dict:
    """config.json of a Hugging Face OlmoeForCausalLM equal to llmtrain's OLMoE for `model_cfg`."""
    conf = llama_hf.hf_config(model_cfg)
    for key in ("mlp_bias", "head_dim"):
        del conf[key]
    conf.update(model_type="olmoe", architectures=[ARCHITECTURE], intermediate_size=moe_args(model_cfg).ffn,
                clip_qkv=None, **qwen3_hf.moe_config(model_cfg))
    return conf


def check_hf_config(conf: dict, path: Path, model_cfg) -> None:
    """Llama's checks (head split, epsilon, rotary settings, tied head, activation), then the routing."""
    llama_hf.check_hf_config(conf, path, model_cfg)
    if conf.get("clip_qkv") is not None:
        qwen3_hf.refuser(path)(f"clip_qkv={conf['clip_qkv']}", "llmtrain's OLMoE does not clip q, k and v")
    qwen3_hf.check_moe_config(conf, path, model_cfg, "num_experts")
