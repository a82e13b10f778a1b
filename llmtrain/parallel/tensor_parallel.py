"""Megatron-style tensor (and sequence) parallel with DTensor's parallelize_module.

Each block's plan comes from its family (FamilySpec.tensor_parallel_plan, model/family.py), from the names of the
block's submodules; this file turns the plan's styles into DTensor styles. q/k/v and the MLP's input matrices are
column-parallel, attn.proj and mlp.proj row-parallel, so a layer needs exactly two all-reduces forward and two
backward. The attention and MLP inputs enter as one replicated DTensor shared by their column-parallel
projections, so q, k and v accumulate their input gradients locally and reduce them once. k and v shard by
key/value head (validation requires n_kv_heads divisible by tp). A mixture of experts is computed whole on every
rank (its input gathered, its output handed back in the residual's layout): exact, with unsharded experts.
The token embedding is vocabulary-parallel and the tied head emits vocabulary-sharded logits for loss_parallel,
so full logits are never gathered. With sequence parallel, the norms, dropout and the residual stream hold
sequence shards (all-gather / reduce-scatter instead of all-reduce).
"""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInputOutput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from llmtrain.parallel.float8 import tensor_parallel_styles

HEADS_DIM = 2  # a per-head norm's input is (b, t, heads, head_dim): the local heads are a shard of this dim


def replicated(residual) -> PrepareModuleInputOutput:
    """A module computed whole on every rank: its input (the residual's layout) gathered and handed in as a plain
    tensor, its plain output handed back in the residual's layout. Every rank computes the same values and the
    same gradients, so its parameters stay plain tensors that need no reduction over tp."""
    return PrepareModuleInputOutput(input_layouts=(residual,), desired_input_layouts=(Replicate(),),
                                    use_local_input=True, output_layouts=(Replicate(),),
                                    desired_output_layouts=(residual,), use_local_output=True)


def block_plan(names: dict[str, str], residual, sequence_parallel: bool, float8: bool) -> dict:
    """The DTensor styles of one block, from its family's {submodule: style} plan."""
    colwise, rowwise, prepare_input = tensor_parallel_styles(float8)
    styles = {
        "gather": lambda: prepare_input(input_layouts=(residual,), desired_input_layouts=(Replicate(),),
                                        use_local_output=False),
        "colwise": colwise,
        "rowwise": lambda: rowwise(output_layouts=residual),
        "replicated": lambda: replicated(residual),
        "sequence": SequenceParallel,
        # The weight becomes a replicated DTensor: its gradient from each rank's heads is summed over tp.
        "head_norm": lambda: SequenceParallel(sequence_dim=HEADS_DIM, use_local_output=True),
    }
    plan = {}
    for name, style in names.items():
        if style not in styles:
            raise ValueError(f"tensor-parallel plan: {name!r} has unknown style {style!r}")
        if style == "sequence" and not sequence_parallel:
            continue  # a replicated residual: the norm runs on whole rows, nothing to do
        plan[name] = styles[style]()
    return plan


def apply_tensor_parallel(model: nn.Module, spec, tp_mesh: DeviceMesh, sequence_parallel: bool,
                          float8: bool = False) -> None:
    """`spec`: the model's FamilySpec (model/registry.py's family_of(model_cfg)), whose plan each block follows.
    `float8`: the blocks hold torchao Float8Linear layers (tensorwise recipe), whose float8 styles cast the
    attention and MLP inputs once, before their all-gather, and the row-parallel inputs before their matmul."""
    residual = Shard(1) if sequence_parallel else Replicate()
    if model.embed is not None:
        plan = {"tok": RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())}
        if sequence_parallel:
            # The embedding (GPT-2: token + position sum) is replicated; hand the blocks their sequence shard.
            plan[""] = PrepareModuleOutput(output_layouts=Replicate(), desired_output_layouts=Shard(1))
        parallelize_module(model.embed, tp_mesh, plan)

    for block in model.layers.values():
        names = {name for name, _ in block.named_modules() if name}
        plan = spec.tensor_parallel_plan(names)
        parallelize_module(block, tp_mesh, block_plan(plan, residual, sequence_parallel, float8))

    if model.norm is not None:
        if sequence_parallel:
            parallelize_module(model.norm, tp_mesh, SequenceParallel())
    if model.head is not None:
        # Vocabulary-sharded logits stay a DTensor so the loss runs under loss_parallel().
        parallelize_module(model.head, tp_mesh, ColwiseParallel(input_layouts=residual, output_layouts=Shard(-1),
                                                                use_local_output=False))
    # ColwiseParallel re-registered the head weight; point it back at the (identically sharded) embedding.
    model.tie_weights()
