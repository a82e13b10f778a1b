"""The reference loss of the output head: full logits, then cross entropy in fp32.

The model calls its `head_loss` with the final hidden states; the trainer may swap in one that never holds the
whole logits (llmtrain/loss/), which must agree with this one."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

IGNORE_INDEX = -100  # F.cross_entropy's default: targets with this value add nothing to the loss


def logits_loss(hidden: torch.Tensor, head: nn.Linear, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross entropy of head(hidden) against targets; under tensor parallel the logits stay vocabulary-sharded
    (the caller runs it under loss_parallel)."""
    logits = head(hidden)
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), ignore_index=IGNORE_INDEX)
