"""Qwen3: Llama's block with an RMSNorm on each head of q and k before the rotation, an explicit head width, no
biases; dense, or a mixture of experts on the sparse layers when model.moe is set (Qwen3-MoE).

The torch module is module.py, the Hugging Face adapter hf.py (Qwen3ForCausalLM and Qwen3MoeForCausalLM); both
are imported only when asked for. Everything else is Llama's (model/llama/__init__.py)."""

from __future__ import annotations

from llmtrain.model.llama import LlamaSpec


class Qwen3Spec(LlamaSpec):
    name = "qwen3"
    title = "Qwen3"
    summary = "Llama's block with per-head q/k RMSNorm; dense or mixture of experts (model.moe)"
    supports_moe = True
    qk_norm = "head"
    module = "llmtrain.model.qwen3.module:build"
    hf = "llmtrain.model.qwen3.hf"
    hf_architecture = "Qwen3ForCausalLM"  # Qwen3MoeForCausalLM when model.moe is set (hf.py)
    hf_model_types = ("qwen3", "qwen3_moe")
    calibration = ""  # its own fitted timings: the q/k norms and experts make its steps unlike Llama's


SPEC = Qwen3Spec()
