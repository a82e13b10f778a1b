"""Dynamic loss scaling for fp16 that is correct under every layout.

torch.amp.GradScaler decides per rank whether gradients overflowed; under tensor or pipeline parallel the ranks then
disagree, issue different collectives and crash or hang. Here each rank only reports its own
flag; the trainer reduces it (MAX) over every rank of the job before anyone decides, so all ranks skip the same
steps and keep the same scale.
"""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor


class DynamicLossScaler:
    def __init__(self, init_scale: float, growth_factor: float, backoff_factor: float, growth_interval: int,
                 enabled: bool = True):
        self.enabled = enabled
        self.scale = float(init_scale) if enabled else 1.0
        self.growth_factor = growth_factor
        self.backoff_factor = backoff_factor
        self.growth_interval = growth_interval
        self.good_steps = 0
        self.skipped_steps = 0

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self.scale if self.enabled else loss

    @torch.no_grad()
    def unscale_and_check(self, params: list[torch.nn.Parameter], device: torch.device) -> bool:
        """Divide gradients by the scale; return True when this rank's gradients hold inf/NaN. The caller agrees
        on the flag across every rank (one MAX all-reduce) before skipping the step."""
        if not self.enabled:
            return False
        found = torch.zeros((), device=device)
        inv = 1.0 / self.scale
        for p in params:
            if p.grad is None:
                continue
            g = p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
            g.mul_(inv)
            found = torch.maximum(found, (~torch.isfinite(g)).any().float())
        return bool(found.item())

    def update(self, overflow: bool) -> None:
        if not self.enabled:
            return
        if overflow:
            self.scale *= self.backoff_factor
            self.good_steps = 0
            self.skipped_steps += 1
        else:
            self.good_steps += 1
            if self.good_steps % self.growth_interval == 0:
                self.scale *= self.growth_factor

    def state_dict(self) -> dict:
        return {"scale": self.scale, "good_steps": self.good_steps, "skipped_steps": self.skipped_steps}

    def load_state_dict(self, state: dict) -> None:
        self.scale = float(state["scale"])
        self.good_steps = int(state["good_steps"])
        self.skipped_steps = int(state["skipped_steps"])
