"""The shared experts: one SwiGLU MLP every token goes through, n_shared_experts x the expert width wide."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class SharedExperts(nn.Module):
    def __init__(self, d_model: int, ffn: int):
        super().__init__()
        self.gate = nn.Linear(d_model, ffn, bias=False)
        self.fc = nn.Linear(d_model, ffn, bias=False)
        self.proj = nn.Linear(ffn, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.silu(self.gate(x)) * self.fc(x))
