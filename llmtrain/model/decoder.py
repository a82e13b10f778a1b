"""The stack every family shares: token embedding, blocks, final norm, output head.

Blocks live in an nn.ModuleDict keyed by their global index so parameter names survive a pipeline split, and a
pipeline stage sets the modules it does not own (embed, norm, head) to None; the parallel code relies on both.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from llmtrain.model.head_loss import logits_loss


class Decoder(nn.Module):
    def __init__(self, args, embed: nn.Module, block: Callable[..., nn.Module], norm: nn.Module):
        """`block(args, layer)` builds block `layer` (a mixture-of-experts model's blocks differ by layer)."""
        super().__init__()
        self.args = args
        self.embed: nn.Module | None = embed
        self.layers = nn.ModuleDict({str(i): block(args, i) for i in range(args.n_layers)})
        self.norm: nn.Module | None = norm
        self.head: nn.Linear | None = nn.Linear(args.d_model, args.vocab_size, bias=False)
        # (hidden, head, targets) -> mean loss; a plain attribute, so the trainer can pick another implementation
        self.head_loss = logits_loss
        self.tie_weights()

    def tie_weights(self) -> None:
        """A tied head shares the token embedding's weight (one parameter, named embed.tok.weight)."""
        if self.args.tie_embeddings and self.embed is not None and self.head is not None:
            self.head.weight = self.embed.tok.weight

    def forward(self, x: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """Token ids (b, t) -> logits (b, t, vocab), or with `targets` (b, t) the mean loss (computed by head_loss,
        which need not hold the whole logits); a pipeline stage without embed/head maps hidden -> hidden."""
        h = self.embed(x) if self.embed is not None else x
        for layer in self.layers.values():
            h = layer(h)
        if self.norm is not None:
            h = self.norm(h)
        if self.head is None:
            return h
        return self.head(h) if targets is None else self.head_loss(h, self.head, targets)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())
