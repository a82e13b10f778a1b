"""FP8 training (precision=fp8) with torchao's float8: the transformer blocks' nn.Linear layers become Float8Linear.

Applied to each model part first, before tensor parallel, recompute, compile and FSDP2 (torchtitan's order), so
each of those takes the float8 layers as they are. Only the blocks' q/k/v, attention projection, MLP fc and proj
are converted: the embedding and the tied head stay under bf16 autocast (the head shares the embedding's weight,
and the logits feed an fp32 loss). A mixture-of-experts block's router and routed experts stay bf16 too (its
shared expert is converted). Float8Linear keeps the `weight` and `bias` parameters of the layer it replaces, so
parameter names, checkpoints and exports are those of any other run.

- tensorwise: with FSDP2 sharding parameters (parallel.zero 2 or 3), weights are cast to float8 before they are
  all-gathered (half the bytes of bf16), and their scales are computed for all weights in one all-reduce after
  each optimizer step; under tensor parallel torchao's float8 styles cast activations before their collectives.
- rowwise, rowwise_with_gw_hp: scales per row; FSDP2 gathers bf16 and tensor parallel uses the plain styles.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace

from torch import nn
from torch.distributed.tensor import DTensor

from llmtrain.config.fp8 import float8_all_gather, float8_tensor_parallel
from llmtrain.parallel.layout import ParallelDims


@dataclass
class Float8Training:
    recipe: str
    # Cast weights to float8 before FSDP2's all-gather; needs tensorwise scaling and a shard group of > 1 rank.
    fsdp_float8_all_gather: bool
    # torchao's Float8ColwiseParallel / Float8RowwiseParallel in place of the plain tensor-parallel styles.
    tensor_parallel_styles: bool
    converted: int = 0  # linear layers converted on this rank
    routers_kept: int = 0  # mixture-of-experts routers left out on this rank

    @classmethod
    def from_config(cls, cfg, dims: ParallelDims) -> "Float8Training | None":
        if cfg.precision.name != "fp8":
            return None
        return cls(recipe=cfg.precision.fp8_recipe, fsdp_float8_all_gather=float8_all_gather(cfg, dims),
                   tensor_parallel_styles=float8_tensor_parallel(cfg))

    def linear_config(self):
        from torchao.float8 import Float8LinearConfig

        config = Float8LinearConfig.from_recipe_name(self.recipe)
        return replace(config, enable_fsdp_float8_all_gather=True) if self.fsdp_float8_all_gather else config

    def convert(self, part: nn.Module) -> None:
        """Swap every nn.Linear inside the part's transformer blocks for a Float8Linear, in place, except a
        mixture-of-experts block's router (its logits pick the experts; n_experts is often no multiple of 16).
        The routed experts are stacked weights, not nn.Linear: they stay in the compute dtype (torchao's grouped
        float8 matmul is not used); a shared expert is a dense MLP and is converted."""
        from torchao.float8 import convert_to_float8_training
        from torchao.float8.float8_linear import Float8Linear

        from llmtrain.model.moe import moe_modules

        routers = {id(m.router) for m in moe_modules(part.layers)}
        self.routers_kept += len(routers)
        convert_to_float8_training(part.layers, config=self.linear_config(),
                                   module_filter_fn=lambda module, fqn: id(module) not in routers)
        self.converted += sum(isinstance(m, Float8Linear) for m in part.layers.modules())

    def after_optimizer_step(self, parts: list[nn.Module]) -> None:
        """The float8 scales of every all-gathered weight, in one all-reduce per part (torchao), instead of one
        amax reduction per weight at each all-gather."""
        if self.fsdp_float8_all_gather:
            from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

            for part in parts:
                precompute_float8_dynamic_scale_for_fsdp(part)

    def describe(self, compiled: bool) -> str:
        extras = [name for name, on in (("float8 FSDP2 all-gather", self.fsdp_float8_all_gather),
                                        ("float8 tensor-parallel styles", self.tensor_parallel_styles)) if on]
        eager = "" if compiled else "; train.compile=false: eager float8 is slower than bf16 (torch.compile fuses " \
                                    "its scaling and casts), set train.compile=true"
        kept = "embedding, head, MoE routers and routed experts in bf16 (torchao's grouped float8 is not used)" \
            if self.routers_kept else "embedding and head in bf16"
        return (f"precision=fp8: {self.converted} linear layers in float8 (recipe {self.recipe}"
                + "".join(f", {e}" for e in extras) + f"), {kept}{eager}")


def tensor_parallel_styles(float8: bool):
    """(column-parallel, row-parallel, module-input) styles: torchao's float8 ones or torch's plain ones."""
    if float8:
        from torchao.float8.float8_tensor_parallel import (
            Float8ColwiseParallel,
            Float8RowwiseParallel,
            PrepareFloat8ModuleInput,
        )

        return Float8ColwiseParallel, Float8RowwiseParallel, PrepareFloat8ModuleInput
    from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, RowwiseParallel

    return ColwiseParallel, RowwiseParallel, PrepareModuleInput


def plain_weights(state: dict) -> dict:
    """A model state dict with torchao's float8 all-gather weights replaced by the fp32 shard each one wraps (the
    same storage), so checkpoints hold plain tensors: they load without torchao (a bf16 run, `llmtrain ckpt
    export`) and pass torch.load's weights-only check, which refuses torchao's wrapper class."""
    fsdp_utils = sys.modules.get("torchao.float8.fsdp_utils")
    if fsdp_utils is None:  # torchao never loaded: no float8 layers in this process
        return state
    wrapper = fsdp_utils.WeightWithDynamicFloat8CastTensor

    def plain(value):
        if isinstance(value, DTensor) and isinstance(value.to_local(), wrapper):
            return DTensor.from_local(value.to_local()._tensor, value.device_mesh, value.placements,
                                      shape=value.shape, stride=value.stride())
        return value._tensor if isinstance(value, wrapper) else value

    return {name: plain(value) for name, value in state.items()}
