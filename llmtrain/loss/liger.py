"""train.loss=liger: Liger-Kernel's fused linear cross entropy (Triton, CUDA only; the liger extra), which, like
the chunked loss, never holds the whole logits. It takes the whole vocabulary, so not under tensor parallel."""

from __future__ import annotations

import torch
from torch import nn

from llmtrain.loss.head import compute_dtype
from llmtrain.model.head_loss import IGNORE_INDEX

_kernel = None


def liger_loss(hidden: torch.Tensor, head: nn.Linear, targets: torch.Tensor) -> torch.Tensor:
    global _kernel
    if _kernel is None:
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

        _kernel = LigerFusedLinearCrossEntropyLoss(ignore_index=IGNORE_INDEX)
    dtype = compute_dtype(head.weight)
    h = hidden.flatten(0, -2).to(dtype)
    return _kernel(head.weight.to(dtype), h, targets.flatten()).float()
