"""The routed experts: n_experts SwiGLU MLPs stored as stacked weights, run over tokens sorted by expert.

`gate` and `fc` (Llama's "up") are [E, f, d] and `proj` ("down") [E, d, f]: each expert's slice is nn.Linear's
(out, in) weight, so Hugging Face per-expert weights stack with no transpose. Two ways to run them, equal up to
float rounding: torch._grouped_mm over the sorted tokens with int32 group ends (one kernel per matrix), or a loop
over the experts' slices of the sorted tokens.

Split over ranks (expert parallel, from outside the model), the weights are DTensors of which this rank runs its
local experts: the counts it is handed are then theirs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor

from llmtrain.model.moe.grouped import compute_dtype


class Experts(nn.Module):
    def __init__(self, n_experts: int, d_model: int, ffn: int):
        super().__init__()
        self.gate = nn.Parameter(torch.empty(n_experts, ffn, d_model))
        self.fc = nn.Parameter(torch.empty(n_experts, ffn, d_model))
        self.proj = nn.Parameter(torch.empty(n_experts, d_model, ffn))

    def forward(self, x: torch.Tensor, counts: torch.Tensor, grouped: bool) -> torch.Tensor:
        """`x` (m, d): tokens sorted by expert, `counts` (E,) tokens per expert. Returns (m, d)."""
        weights = [_local(w) for w in (self.gate, self.fc, self.proj)]
        if grouped:
            return grouped_swiglu(x, counts, *weights)
        return looped_swiglu(x, counts, *weights)


def _local(weight: torch.Tensor) -> torch.Tensor:
    return weight.to_local() if isinstance(weight, DTensor) else weight


def grouped_swiglu(x: torch.Tensor, counts: torch.Tensor, gate: torch.Tensor, fc: torch.Tensor,
                   proj: torch.Tensor, grouped_mm=None) -> torch.Tensor:
    """Group e is rows [ends[e-1], ends[e]) of `x`; no host synchronization. `grouped_mm` defaults to
    torch._grouped_mm (tests pass a reference to check the index arithmetic where the kernel cannot run)."""
    mm = grouped_mm or torch._grouped_mm
    # Autocast does not cover torch._grouped_mm: cast as it would for F.linear (no-op outside autocast).
    dtype = compute_dtype(x)
    x, gate, fc, proj = (t.to(dtype) for t in (x, gate, fc, proj))
    ends = torch.cumsum(counts, dim=0, dtype=torch.int32)
    hidden = F.silu(mm(x, gate.mT, offs=ends)) * mm(x, fc.mT, offs=ends)
    return mm(hidden, proj.mT, offs=ends)


# Its slices have data-dependent sizes: compiled, every new split of the tokens would be a recompile.
@torch.compiler.disable
def looped_swiglu(x: torch.Tensor, counts: torch.Tensor, gate: torch.Tensor, fc: torch.Tensor,
                  proj: torch.Tensor) -> torch.Tensor:
    """One SwiGLU per expert over its slice of `x`; the group sizes are read on the host. Empty slices too: every
    weight then gets a gradient (zeros) even on a rank whose experts got no token, as data parallel needs."""
    outs = [F.linear(F.silu(F.linear(chunk, gate[e])) * F.linear(chunk, fc[e]), proj[e])
            for e, chunk in enumerate(torch.split(x, counts.tolist()))]
    return torch.cat(outs)
