"""Optional NVIDIA apex for optim.fused=apex: FusedAdam (extension amp_C); FusedLayerNorm (fused_layer_norm_cuda)
is swapped in by llmtrain.model.apex_norm.

apex is not on PyPI and is only imported here, when asked for; validation has already turned a missing apex (or
one built without those two extensions) into a one-line error saying how to build it, and a layout whose
parameters are DTensors (apex's kernels take plain tensors) into another. Current apex has no `amp`: its O1 recipe
is precision=fp16 (autocast + dynamic loss scaling), and bf16 needs no scaling at all.
"""

from __future__ import annotations

import torch


def fused_adam(groups: list[dict], train_cfg) -> torch.optim.Optimizer:
    from apex.optimizers import FusedAdam

    class FusedAdamW(FusedAdam):
        """apex's FusedAdam in AdamW mode. apex counts steps per param group; the count is also kept in every
        parameter's state as torch's AdamW keeps it (a CPU float32 scalar), so checkpoints save and restore it
        by parameter name and a run resumes exactly, with this kernel or torch's."""

        def step(self, closure=None):
            for group in self.param_groups:
                if "step" not in group:  # first step, or right after a checkpoint filled the state
                    saved = [self.state[p]["step"] for p in group["params"] if "step" in self.state.get(p, {})]
                    if saved:
                        group["step"] = int(saved[0])
            loss = super().step(closure)
            for group in self.param_groups:
                if "step" in group:
                    count = torch.tensor(float(group["step"]))
                    for p in group["params"]:
                        if p in self.state:
                            self.state[p]["step"] = count
            return loss

    return FusedAdamW(groups, lr=train_cfg.lr, betas=(train_cfg.beta1, train_cfg.beta2), eps=train_cfg.eps,
                      adam_w_mode=True)
