"""Initialization that gives the same weights whatever the parallel layout.

Each parameter is drawn from its own generator, seeded by (seed, parameter name), as a full tensor; a sharded
(DTensor) parameter then keeps only its local slice. So a 1-process run, DP, TP, PP and any mix start from
bit-identical weights, and parameters can be created on the meta device and materialized after sharding.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping

import torch
from torch import nn
from torch.distributed.tensor import DTensor, distribute_tensor

# Residual output projections get std / sqrt(2 * n_layers) (GPT-2 paper, section 2.3): a mixture of experts'
# down projections (experts.proj) and its shared expert's too.
_RESIDUAL_PROJECTIONS = ("attn.proj.weight", "mlp.proj.weight", "mlp.experts.proj", "mlp.shared.proj.weight")


def parameter_seed(seed: int, name: str) -> int:
    """The generator seed of parameter `name`: fixed hash of "seed:name", so every layout draws the same values
    (changing the hash would change every fresh run's initial weights)."""
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def full_init_value(name: str, shape: torch.Size, seed: int, std: float, n_layers: int) -> torch.Tensor:
    """The full fp32 value of parameter `name` (GPT-2 init, for Llama too); a pure function of its arguments."""
    if name.endswith(".bias"):
        return torch.zeros(shape)
    # LayerNorm and RMSNorm gains, the q and k norms' too
    if ".ln_" in name or name.startswith("norm.") or name.endswith("norm.weight"):
        return torch.ones(shape)
    if name.endswith(_RESIDUAL_PROJECTIONS):
        std = std / math.sqrt(2 * n_layers)
    gen = torch.Generator().manual_seed(parameter_seed(seed, name))
    return torch.randn(shape, generator=gen) * std


@torch.no_grad()
def init_parameters(model: nn.Module, seed: int, std: float, n_layers: int,
                    pretrained: Mapping[str, torch.Tensor] | None = None) -> None:
    """Fill every parameter of `model` (plain or DTensor, already on its device) with its layout-free value:
    the `pretrained` full tensor of that name when given (model.init_from), else the seeded GPT-2 init; and
    recompute the buffers (rotary frequencies, a mixture of experts' balancing bias and statistics) that
    materializing a meta-device model left uninitialized: every module's reset_buffers()."""
    tied = model.args.tie_embeddings
    for name, param in model.named_parameters():
        name = name.replace("_checkpoint_wrapped_module.", "")
        # A pipeline's last stage holds its own copy of a tied head: same value as the embedding.
        name = "embed.tok.weight" if tied and name == "head.weight" else name
        if pretrained is not None:
            full = pretrained[name].to(torch.float32)
        else:
            full = full_init_value(name, param.shape, seed, std, n_layers)
        if isinstance(param, DTensor):
            # src_data_rank=None: every rank holds the same full value, so each slices locally (no communication).
            local = distribute_tensor(full, param.device_mesh, param.placements, src_data_rank=None).to_local()
            param.to_local().copy_(local)
        else:
            param.copy_(full)
    for module in model.modules():
        if callable(getattr(module, "reset_buffers", None)):
            module.reset_buffers()
