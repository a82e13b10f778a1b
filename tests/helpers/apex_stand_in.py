"""A stand-in apex package for the optimizer tests, and their one-process run settings."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import SMALL


# What llmtrain uses of current apex, with the interface quirks of the real classes: FusedAdam keeps one step count
# per param group (none per parameter) and its zero_grad() takes no set_to_none. amp_C and fused_layer_norm_cuda
# stand for the CUDA extensions, which validation looks for.
STAND_IN = {
    "apex/__init__.py": "from . import normalization, optimizers  # noqa: F401\n",
    "apex/normalization/__init__.py": '''
from torch import nn


class FusedLayerNorm(nn.LayerNorm):
    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, memory_efficient=False):
        super().__init__(normalized_shape, eps=eps, elementwise_affine=elementwise_affine)
        print("apex stand-in: FusedLayerNorm", flush=True)
''',
    "apex/optimizers/__init__.py": '''
import math

import torch


class FusedAdam(torch.optim.AdamW):
    def __init__(self, params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999), eps=1e-8, adam_w_mode=True,
                 weight_decay=0.0, amsgrad=False, set_grad_none=True, capturable=False, master_weights=False):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, foreach=False)
        print("apex stand-in: FusedAdam", flush=True)

    def zero_grad(self):
        for group in self.param_groups:
            for p in group["params"]:
                p.grad = None

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            group["step"] = group["step"] + 1 if "step" in group else 1
            beta1, beta2 = group["betas"]
            t, lr = group["step"], group["lr"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if len(state) == 0:
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                m, v = state["exp_avg"], state["exp_avg_sq"]
                p.mul_(1 - lr * group["weight_decay"])
                m.lerp_(p.grad, 1 - beta1)
                v.mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
                denom = (v.sqrt() / math.sqrt(1 - beta2 ** t)).add_(group["eps"])
                p.addcdiv_(m, denom, value=-lr / (1 - beta1 ** t))
''',
    "amp_C.py": "",
    "fused_layer_norm_cuda.py": "",
}


ONE_PROCESS = [*SMALL, "data=synthetic", "hardware=cpu", "cluster.nproc_per_node=1", "train.global_batch_size=4",
               "train.micro_batch_size=4", "train.max_steps=4", "checkpoint.at_end=false"]


@pytest.fixture
def stand_in_apex(tmp_path, monkeypatch):
    """Call with extensions=False for a Python-only apex. Importable in this process and, through PYTHONPATH, in
    the processes it starts; forgotten again afterwards (find_spec would otherwise find the cached modules)."""
    import importlib
    import sys

    def install(extensions: bool = True) -> Path:
        root = tmp_path / "site"
        for name, text in STAND_IN.items():
            if extensions or not name.endswith(("_C.py", "_cuda.py")):
                (root / name).parent.mkdir(parents=True, exist_ok=True)
                (root / name).write_text(text)
        monkeypatch.syspath_prepend(str(root))
        importlib.invalidate_caches()
        return root

    yield install
    for name in [m for m in sys.modules if m.split(".")[0] in ("apex", "amp_C", "fused_layer_norm_cuda")]:
        del sys.modules[name]
