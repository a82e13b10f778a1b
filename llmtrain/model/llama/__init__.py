"""Llama 3: rotary positions, pre-RMSNorm blocks, SwiGLU MLP, grouped-query attention, no biases, tied or untied
head.

The torch module is module.py, the Hugging Face adapter hf.py; both are imported only when asked for. The family
defaults of model/family.py describe this block, so the spec holds only its keys and their checks."""

from __future__ import annotations

from llmtrain.model.family import FamilySpec, Require, head_width, positive

# The keys of the Llama block (rotary positions, grouped-query attention, SwiGLU sizing, an untied head), which
# families built on it read too.
LLAMA_KEYS = ("n_kv_heads", "rope_theta", "rope_scaling", "ffn_dim_multiplier", "multiple_of", "tie_embeddings")


def swiglu_width(m) -> int:
    """int(2/3 of 4 x d_model), times model.ffn_dim_multiplier, rounded up to model.multiple_of: SwiGLU's three
    matrices stay near two of 4 x d_model."""
    hidden = int(2 * 4 * m.d_model / 3)
    if m.ffn_dim_multiplier is not None:
        hidden = int(m.ffn_dim_multiplier * hidden)
    return m.multiple_of * ((hidden + m.multiple_of - 1) // m.multiple_of)


def validate_llama_keys(cfg, require: Require) -> None:
    """The checks of LLAMA_KEYS and of the rotary head width."""
    m = cfg.model
    if m.n_kv_heads is not None:
        positive(cfg, require, "model.n_kv_heads")
        require(m.n_heads % m.n_kv_heads == 0, "model.n_kv_heads",
                f"n_heads={m.n_heads} must be divisible by n_kv_heads={m.n_kv_heads}")
    width = head_width(m)
    require(width % 2 == 0, "model.head_dim",
            f"rotary positions pair a head's dimensions, so the head width must be even (got {width}"
            + ("" if m.head_dim else f" = d_model {m.d_model} / n_heads {m.n_heads}") + ")")
    positive(cfg, require, "model.rope_theta", "model.multiple_of")
    if m.ffn_dim_multiplier is not None:
        positive(cfg, require, "model.ffn_dim_multiplier")
    s = m.rope_scaling
    if s is not None:
        positive(cfg, require, "model.rope_scaling.factor", "model.rope_scaling.low_freq_factor",
                 "model.rope_scaling.original_max_position_embeddings")
        require(s.high_freq_factor > s.low_freq_factor, "model.rope_scaling.high_freq_factor",
                f"must exceed low_freq_factor={s.low_freq_factor} (got {s.high_freq_factor})")


class LlamaSpec(FamilySpec):
    name = "llama"
    title = "Llama"
    summary = "rotary positions, RMSNorm, SwiGLU, grouped-query attention, no biases, tied or untied head"
    keys = LLAMA_KEYS
    supports_moe = True  # its block puts the MoE block on sparse layers (an HF export refuses: no experts there)
    module = "llmtrain.model.llama.module:build"
    hf = "llmtrain.model.llama.hf"
    hf_architecture = "LlamaForCausalLM"
    hf_model_types = ("llama",)
    calibration = "llama"

    def validate(self, cfg, require: Require) -> None:
        validate_llama_keys(cfg, require)

    def ffn_dim(self, m) -> int:
        return swiglu_width(m)


SPEC = LlamaSpec()
