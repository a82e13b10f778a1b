"""train.loss=chunked as the model's head_loss: the compute dtype settled, the tensors made local, then chunks."""

from __future__ import annotations

import torch
from torch import nn

from llmtrain.loss import chunk_tokens_for
from llmtrain.loss.chunked import ChunkedLinearCrossEntropy
from llmtrain.loss.vocab_parallel import local_head


def compute_dtype(tensor: torch.Tensor) -> torch.dtype:
    """What a matmul of `tensor` runs in here: autocast's dtype when autocast is on, else the tensor's own."""
    device = tensor.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else tensor.dtype


class ChunkedHeadLoss:
    def __init__(self, chunk_tokens: int | None = None):
        self.chunk_tokens = chunk_tokens  # None: chunk_tokens_for's default

    def __call__(self, hidden: torch.Tensor, head: nn.Linear, targets: torch.Tensor) -> torch.Tensor:
        part = local_head(hidden, head.weight)
        dtype = compute_dtype(part.weight)
        h, w = part.hidden.to(dtype), part.weight.to(dtype)  # autocast's casts, made once
        chunk = self.chunk_tokens or chunk_tokens_for(h.shape[0], w.shape[0], h.shape[1])
        # Not from the tensors alone: in evaluation (no_grad) a parameter still has requires_grad set.
        needs_grad = torch.is_grad_enabled() and (h.requires_grad or w.requires_grad)
        with torch.autocast(h.device.type, enabled=False):
            return ChunkedLinearCrossEntropy.apply(h, w, targets.flatten(), chunk, part.group, part.vocab_start,
                                                   needs_grad)
