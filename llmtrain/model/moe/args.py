"""model.moe as the MoE block's arguments (no torch: config validation and the planner read them too)."""

from __future__ import annotations

from dataclasses import dataclass

# torch._grouped_mm needs every row stride 16-byte aligned: widths a multiple of 8 serve bf16 (2 bytes) and fp32.
GROUPED_MM_WIDTH_MULTIPLE = 8


@dataclass(frozen=True)
class MoEArgs:
    n_experts: int
    top_k: int
    ffn: int  # one expert's hidden width (model.moe.expert_ffn_dim, else the model's ffn_dim)
    n_shared_experts: int = 0
    norm_topk_prob: bool = True
    score_func: str = "softmax"
    bias_update_rate: float = 0.0
    router_aux_loss_coef: float = 0.001
    router_z_loss_coef: float = 0.0
    n_dense_layers: int = 0
    sparse_every: int = 1
    grouped_mm: str = "auto"

    @classmethod
    def from_config(cls, model_cfg) -> "MoEArgs | None":
        """None for a dense model (model.moe null)."""
        moe = getattr(model_cfg, "moe", None)
        if moe is None:
            return None
        from llmtrain.config.derived import ffn_dim

        width = moe.expert_ffn_dim if moe.expert_ffn_dim is not None else ffn_dim(model_cfg)
        return cls(n_experts=moe.n_experts, top_k=moe.top_k, ffn=width, n_shared_experts=moe.n_shared_experts,
                   norm_topk_prob=moe.norm_topk_prob, score_func=moe.score_func,
                   bias_update_rate=moe.bias_update_rate, router_aux_loss_coef=moe.router_aux_loss_coef,
                   router_z_loss_coef=moe.router_z_loss_coef, n_dense_layers=moe.n_dense_layers,
                   sparse_every=moe.sparse_every, grouped_mm=moe.grouped_mm)

    def is_sparse(self, layer: int) -> bool:
        """Layer `layer` (global index) holds the mixture of experts (Qwen3-MoE's decoder_sparse_step rule)."""
        return layer >= self.n_dense_layers and (layer + 1) % self.sparse_every == 0

    @property
    def shared_ffn(self) -> int:
        """The shared experts' hidden width together (0 = none)."""
        return self.n_shared_experts * self.ffn


def grouped_mm_width_problem(d_model: int, ffn: int) -> str | None:
    """Why torch._grouped_mm cannot take these widths (model.moe.grouped_mm=on refuses them), or None."""
    bad = [f"{name} {v}" for name, v in (("d_model", d_model), ("expert width", ffn))
           if v % GROUPED_MM_WIDTH_MULTIPLE]
    if not bad:
        return None
    return (f"torch._grouped_mm needs 16-byte aligned rows: {' and '.join(bad)} not a multiple of "
            f"{GROUPED_MM_WIDTH_MULTIPLE}")
