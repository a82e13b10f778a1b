"""The mixture-of-experts block any family may use for its sparse layers (not a family itself).

MoEArgs (args.py) has no torch; MoE and moe_modules are imported on first use, so config code may import this
package without torch.
"""

from __future__ import annotations

from llmtrain.model.moe.args import MoEArgs

__all__ = ["MoE", "MoEArgs", "moe_modules"]


def __getattr__(name: str):
    if name in ("MoE", "moe_modules"):
        from llmtrain.model.moe import layer

        return getattr(layer, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
