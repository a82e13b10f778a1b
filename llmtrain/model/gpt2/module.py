"""GPT-2 architecture: learned positions, pre-LayerNorm blocks, GELU MLP, output head tied to the token embedding.

Parallelism is applied from outside (llmtrain.parallel); the stack shared with Llama (embedding, blocks keyed
by global index, final norm, head) is model/decoder.py. q, k and v are separate projections so tensor parallel
can shard them by head without reordering a fused weight.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from llmtrain.model.decoder import Decoder


@dataclass
class GPTArgs:
    """vocab_size here is the number of embedding rows (the config's vocabulary after padding)."""

    n_layers: int
    n_heads: int
    d_model: int
    vocab_size: int
    seq_len: int
    head_dim: int | None = None  # None = d_model // n_heads
    dropout: float = 0.0
    ffn_dim: int | None = None  # None = 4 * d_model
    norm_eps: float = 1e-5
    tie_embeddings = True  # GPT-2 always ties its head to the token embedding

    @property
    def attn_dim(self) -> int:
        return self.n_heads * (self.head_dim or self.d_model // self.n_heads)

    @property
    def mlp_dim(self) -> int:
        return self.ffn_dim or 4 * self.d_model

    @classmethod
    def from_config(cls, model_cfg) -> "GPTArgs":
        from llmtrain.config.derived import ffn_dim, padded_vocab_size

        return cls(n_layers=model_cfg.n_layers, n_heads=model_cfg.n_heads, d_model=model_cfg.d_model,
                   vocab_size=padded_vocab_size(model_cfg), seq_len=model_cfg.seq_len, head_dim=model_cfg.head_dim,
                   dropout=model_cfg.dropout, ffn_dim=ffn_dim(model_cfg), norm_eps=model_cfg.norm_eps)


class Attention(nn.Module):
    def __init__(self, args: GPTArgs):
        super().__init__()
        self.head_dim = args.attn_dim // args.n_heads
        self.q = nn.Linear(args.d_model, args.attn_dim)
        self.k = nn.Linear(args.d_model, args.attn_dim)
        self.v = nn.Linear(args.d_model, args.attn_dim)
        self.proj = nn.Linear(args.attn_dim, args.d_model)
        self.dropout = args.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        # -1 heads: under tensor parallel each rank holds n_heads / tp of them.
        q, k, v = (proj(x).view(b, t, -1, self.head_dim).transpose(1, 2) for proj in (self.q, self.k, self.v))
        y = self.core(q, k, v)
        return self.proj(y.transpose(1, 2).reshape(b, t, -1))

    def core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Causal softmax(q k^T / sqrt(d)) v; a method of its own so selective recompute can wrap just this."""
        return F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                              dropout_p=self.dropout if self.training else 0.0)


class MLP(nn.Module):
    def __init__(self, args: GPTArgs):
        super().__init__()
        self.fc = nn.Linear(args.d_model, args.mlp_dim)
        self.proj = nn.Linear(args.mlp_dim, args.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, args: GPTArgs, layer: int = 0):
        super().__init__()
        self.ln_1 = nn.LayerNorm(args.d_model, eps=args.norm_eps)
        self.attn = Attention(args)
        self.ln_2 = nn.LayerNorm(args.d_model, eps=args.norm_eps)
        self.mlp = MLP(args)
        self.drop = nn.Dropout(args.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop(self.attn(self.ln_1(x)))
        return x + self.drop(self.mlp(self.ln_2(x)))


class Embedding(nn.Module):
    """Token + learned position embedding."""

    def __init__(self, args: GPTArgs):
        super().__init__()
        self.tok = nn.Embedding(args.vocab_size, args.d_model)
        self.pos = nn.Embedding(args.seq_len, args.d_model)
        self.drop = nn.Dropout(args.dropout)
        # The positions of the tokens it embeds, when they are not 0..t-1 (a rank holding other parts of the
        # sequence sets them); None: 0..t-1.
        self.token_positions: torch.Tensor | None = None

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        positions = self.token_positions
        if positions is None:
            positions = torch.arange(idx.shape[1], device=idx.device)
        return self.drop(self.tok(idx) + self.pos(positions))


class GPT(Decoder):
    def __init__(self, args: GPTArgs):
        super().__init__(args, Embedding(args), Block, nn.LayerNorm(args.d_model, eps=args.norm_eps))


def build(model_cfg) -> GPT:
    """The family's module factory (model/gpt2/__init__.py's SPEC.module)."""
    return GPT(GPTArgs.from_config(model_cfg))
