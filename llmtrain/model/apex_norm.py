"""optim.fused=apex's FusedLayerNorm (extension fused_layer_norm_cuda), swapped in before the model is sharded.

apex is not on PyPI and is imported only when asked for; the launcher has already refused a missing apex with a
one-line error saying how to build it."""

from __future__ import annotations

from torch import nn


def fused_layernorm(model: nn.Module) -> None:
    """Swap every nn.LayerNorm for apex's FusedLayerNorm, keeping the parameters (and so their names)."""
    from apex.normalization import FusedLayerNorm

    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.LayerNorm:
                fused = FusedLayerNorm(child.normalized_shape, eps=child.eps,
                                       elementwise_affine=child.elementwise_affine)
                fused.weight, fused.bias = child.weight, child.bias
                setattr(parent, name, fused)
