"""Llama-3-style decoder: rotary positions, pre-RMSNorm blocks, SwiGLU MLP, grouped-query attention, no biases,
output head tied to the token embedding or not.

Built on the same stack as GPT-2 (model/decoder.py), so the same parallel code applies from outside
(llmtrain.parallel); q/k/v are separate projections (k and v with n_kv_heads heads) so tensor parallel shards
them by head.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from llmtrain.model.decoder import Decoder
from llmtrain.model.family import moe_args
from llmtrain.model.rope import apply_rotary, cos_sin, inverse_frequencies


@dataclass
class LlamaArgs:
    """vocab_size here is the number of embedding rows (the config's vocabulary after padding)."""

    n_layers: int
    n_heads: int
    d_model: int
    vocab_size: int
    seq_len: int
    ffn_dim: int
    n_kv_heads: int | None = None  # None = n_heads
    head_dim: int | None = None  # None = d_model // n_heads
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: object | None = None  # model.rope_scaling (RopeScalingConfig) or None
    tie_embeddings: bool = True
    moe: object | None = None  # MoEArgs (model/moe/args.py) of a mixture-of-experts model; None = dense

    @property
    def head_width(self) -> int:
        return self.head_dim or self.d_model // self.n_heads

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    @classmethod
    def from_config(cls, model_cfg) -> "LlamaArgs":
        from llmtrain.config.derived import ffn_dim, kv_heads, padded_vocab_size
        from llmtrain.config.schema import RopeScalingConfig

        scaling = model_cfg.rope_scaling
        return cls(n_layers=model_cfg.n_layers, n_heads=model_cfg.n_heads, d_model=model_cfg.d_model,
                   vocab_size=padded_vocab_size(model_cfg), seq_len=model_cfg.seq_len, ffn_dim=ffn_dim(model_cfg),
                   n_kv_heads=kv_heads(model_cfg), head_dim=model_cfg.head_dim, norm_eps=model_cfg.norm_eps,
                   rope_theta=model_cfg.rope_theta,
                   rope_scaling=None if scaling is None else RopeScalingConfig(**scaling),
                   tie_embeddings=model_cfg.tie_embeddings, moe=moe_args(model_cfg))


class Rotary(nn.Module):
    """Rotates q and k by position. Its inverse frequencies are a non-persistent buffer (in no checkpoint);
    reset_buffers() recomputes them after a model built on the meta device is materialized."""

    def __init__(self, args: LlamaArgs):
        super().__init__()
        self.head_dim, self.theta, self.scaling = args.head_width, args.rope_theta, args.rope_scaling
        self.register_buffer("inv_freq", self._frequencies(), persistent=False)
        # The positions of the tokens this module sees, when they are not 0..t-1 (a rank holding other parts of
        # the sequence sets them); None: 0..t-1.
        self.token_positions: torch.Tensor | None = None

    def _frequencies(self) -> torch.Tensor:
        return inverse_frequencies(self.head_dim, self.theta, self.scaling)

    @torch.no_grad()
    def reset_buffers(self) -> None:
        self.inv_freq.copy_(self._frequencies())

    def forward(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # Computed here, from q's length: under sequence parallel only attention sees the whole sequence.
        cos, sin = cos_sin(self.inv_freq.to(q.device), q.shape[2], self.token_positions)
        return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)


class Attention(nn.Module):
    def __init__(self, args: LlamaArgs):
        super().__init__()
        self.head_dim = args.head_width
        self.q = nn.Linear(args.d_model, args.n_heads * self.head_dim, bias=False)
        self.k = nn.Linear(args.d_model, args.kv_heads * self.head_dim, bias=False)
        self.v = nn.Linear(args.d_model, args.kv_heads * self.head_dim, bias=False)
        self.proj = nn.Linear(args.n_heads * self.head_dim, args.d_model, bias=False)
        self.rope = Rotary(args)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        # -1 heads: under tensor parallel each rank holds n_heads / tp query and n_kv_heads / tp key/value heads.
        q, k, v = (proj(x).view(b, t, -1, self.head_dim).transpose(1, 2) for proj in (self.q, self.k, self.v))
        q, k = self.rope(q, k)
        y = self.core(q, k, v)
        return self.proj(y.transpose(1, 2).reshape(b, t, -1))

    def core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Causal softmax(q k^T / sqrt(d)) v, each group of query heads sharing one key/value head; a method of its
        own so selective recompute can wrap just this."""
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=q.shape[1] != k.shape[1])


class MLP(nn.Module):
    """SwiGLU: proj(silu(gate(x)) * fc(x)); fc is Llama's "up" and proj its "down" projection."""

    def __init__(self, args: LlamaArgs):
        super().__init__()
        self.gate = nn.Linear(args.d_model, args.ffn_dim, bias=False)
        self.fc = nn.Linear(args.d_model, args.ffn_dim, bias=False)
        self.proj = nn.Linear(args.ffn_dim, args.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.silu(self.gate(x)) * self.fc(x))


def feed_forward(args: LlamaArgs, layer: int) -> nn.Module:
    """Block `layer`'s MLP: SwiGLU, or the mixture of experts on a sparse layer of a MoE model."""
    if args.moe is None or not args.moe.is_sparse(layer):
        return MLP(args)
    from llmtrain.model.moe import MoE

    return MoE(args.d_model, args.moe, layer)


class Block(nn.Module):
    def __init__(self, args: LlamaArgs, layer: int = 0):
        super().__init__()
        self.ln_1 = nn.RMSNorm(args.d_model, eps=args.norm_eps)
        self.attn = Attention(args)
        self.ln_2 = nn.RMSNorm(args.d_model, eps=args.norm_eps)
        self.mlp = feed_forward(args, layer)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Embedding(nn.Module):
    """Token embedding only: positions enter through the rotation of q and k."""

    def __init__(self, args: LlamaArgs):
        super().__init__()
        self.tok = nn.Embedding(args.vocab_size, args.d_model)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.tok(idx)


class Llama(Decoder):
    def __init__(self, args: LlamaArgs):
        super().__init__(args, Embedding(args), Block, nn.RMSNorm(args.d_model, eps=args.norm_eps))


def build(model_cfg) -> Llama:
    """The family's module factory (model/llama/__init__.py's SPEC.module)."""
    return Llama(LlamaArgs.from_config(model_cfg))
