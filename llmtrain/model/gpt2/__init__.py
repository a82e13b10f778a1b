"""GPT-2: learned positions, pre-LayerNorm blocks, GELU MLP, biases, head tied to the token embedding.

The torch module is module.py, the Hugging Face adapter hf.py; both are imported only when asked for."""

from __future__ import annotations

from llmtrain.model.family import BlockShape, FamilySpec, head_width


class GPT2Spec(FamilySpec):
    name = "gpt2"
    title = "GPT-2"
    summary = "learned positions, LayerNorm, GELU MLP, biases, tied head"
    keys = ("dropout",)
    learned_positions = True
    always_tied = True
    module = "llmtrain.model.gpt2.module:build"
    hf = "llmtrain.model.gpt2.hf"
    hf_architecture = "GPT2LMHeadModel"
    hf_model_types = ("gpt2",)
    calibration = "gpt"  # the name `llmtrain tune` has always saved GPT-2's fitted timings under

    def kv_heads(self, m) -> int:
        return m.n_heads  # one key/value head per query head

    def mlp_width_key(self, m) -> str:
        return "the MLP width (4 x d_model)" if m.ffn_dim is None else "the MLP width (model.ffn_dim)"

    def block_shape(self, m, layer: int = 0) -> BlockShape:
        width = head_width(m)
        return BlockShape(d_model=m.d_model, attention=m.n_heads * width, kv=m.n_heads * width,
                          ffn=m.ffn_dim or self.ffn_dim(m), gated=False, biases=True)

    def shape_key(self, leaf: str, dim: int) -> str:
        module = leaf.rpartition(".")[0]
        if module in ("attn.k", "attn.v") and dim == 0:
            return "model.n_heads"
        if (module == "mlp.fc" and dim == 0) or (module == "mlp.proj" and dim == 1):
            return "model.d_model"  # 4 x d_model unless model.ffn_dim is set
        return super().shape_key(leaf, dim)


SPEC = GPT2Spec()
