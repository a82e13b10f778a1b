"""Megatron-style tensor (and sequence) parallel with DTensor's parallelize_module.

Per block: q/k/v and mlp.fc (and Llama's mlp.gate) column-parallel, attn.proj and mlp.proj row-parallel, so a layer needs exactly two
all-reduces forward and two backward. The attention and MLP inputs enter as one replicated DTensor shared by their
column-parallel projections, so q, k and v accumulate their input gradients locally and reduce them once.
The token embedding is vocabulary-parallel and the tied head emits vocabulary-sharded logits for loss_parallel,
so full logits are never gathered. With sequence parallel, LayerNorms, dropout and the residual stream hold
sequence shards (all-gather / reduce-scatter instead of all-reduce). Llama's k and v shard by key/value head
(validation requires n_kv_heads divisible by tp), and its RMSNorms are handled like the LayerNorms.
"""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from llmtrain.parallel.float8 import tensor_parallel_styles


def apply_tensor_parallel(model: nn.Module, tp_mesh: DeviceMesh, sequence_parallel: bool, float8: bool = False) -> None:
    """`float8`: the blocks hold torchao Float8Linear layers (tensorwise recipe), whose float8 styles cast the
    attention and MLP inputs once, before their all-gather, and the row-parallel inputs before their matmul."""
    residual = Shard(1) if sequence_parallel else Replicate()
    colwise, rowwise, prepare_input = tensor_parallel_styles(float8)
    if model.embed is not None:
        plan = {"tok": RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())}
        if sequence_parallel:
            # The embedding (GPT-2: token + position sum) is replicated; hand the blocks their sequence shard.
            plan[""] = PrepareModuleOutput(output_layouts=Replicate(), desired_output_layouts=Shard(1))
        parallelize_module(model.embed, tp_mesh, plan)

    for block in model.layers.values():
        plan = {
            "attn": prepare_input(input_layouts=(residual,), desired_input_layouts=(Replicate(),),
                                  use_local_output=False),
            "attn.q": colwise(),
            "attn.k": colwise(),
            "attn.v": colwise(),
            "attn.proj": rowwise(output_layouts=residual),
            "mlp": prepare_input(input_layouts=(residual,), desired_input_layouts=(Replicate(),),
                                 use_local_output=False),
            "mlp.fc": colwise(),
            "mlp.proj": rowwise(output_layouts=residual),
        }
        if hasattr(block.mlp, "gate"):  # Llama's SwiGLU
            plan["mlp.gate"] = colwise()
        if sequence_parallel:
            plan["ln_1"] = SequenceParallel()
            plan["ln_2"] = SequenceParallel()
        parallelize_module(block, tp_mesh, plan)

    if model.norm is not None:
        if sequence_parallel:
            parallelize_module(model.norm, tp_mesh, SequenceParallel())
    if model.head is not None:
        # Vocabulary-sharded logits stay a DTensor so the loss runs under loss_parallel().
        parallelize_module(model.head, tp_mesh, ColwiseParallel(input_layouts=residual, output_layouts=Shard(-1),
                                                                use_local_output=False))
    # ColwiseParallel re-registered the head weight; point it back at the (identically sharded) embedding.
    model.tie_weights()
