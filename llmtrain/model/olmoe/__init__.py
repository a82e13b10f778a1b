"""OLMoE: Llama's block with an RMSNorm over the whole width of q and of k (all heads at once) before the
rotation, and the mixture of experts on its sparse layers: model.moe is required. A norm over all heads needs them
on one rank, so tensor parallel is refused.

The torch module is module.py, the Hugging Face adapter hf.py (OlmoeForCausalLM); both are imported only when
asked for."""

from __future__ import annotations

from llmtrain.model.family import Require
from llmtrain.model.qwen3 import Qwen3Spec


class OlmoeSpec(Qwen3Spec):
    name = "olmoe"
    title = "OLMoE"
    summary = "Llama's block with q/k RMSNorm over all heads; always a mixture of experts"
    qk_norm = "full"
    module = "llmtrain.model.olmoe.module:build"
    hf = "llmtrain.model.olmoe.hf"
    hf_architecture = "OlmoeForCausalLM"
    hf_model_types = ("olmoe",)

    def validate(self, cfg, require: Require) -> None:
        super().validate(cfg, require)
        require(cfg.model.moe is not None, "model.moe",
                "model.arch=olmoe is always a mixture of experts; set model.moe (model=olmoe-1b-7b sets OLMoE's)")
        require(cfg.parallel.tp == 1, "parallel.tp",
                f"model.arch=olmoe normalizes q and k over all heads at once, which tensor parallel splits over "
                f"ranks; use parallel.tp=1 (got {cfg.parallel.tp})")

    def shape_key(self, leaf: str, dim: int) -> str:
        if leaf == "attn.q_norm.weight":
            return "model.n_heads"
        if leaf == "attn.k_norm.weight":
            return "model.n_kv_heads"
        return super().shape_key(leaf, dim)


SPEC = OlmoeSpec()
