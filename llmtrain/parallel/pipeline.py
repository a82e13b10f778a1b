"""Pipeline parallel with torch.distributed.pipelining: split the model by layers into stages, keep parameter names.

Each stage is a copy of the model (GPT or Llama) that keeps only its layers (ModuleDict keys are global layer indices, so names
like layers.7.mlp.fc.weight are the same in every layout); the first stage keeps the embedding, the last the final
norm and head. Looped schedules place stage s on pp rank s % pp; V-shaped ones (zbv, dualpipe_v) place stages
r and S-1-r on rank r.
"""

from __future__ import annotations

import copy
import functools

import torch
from torch import nn
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import (
    FORWARD,
    OVERLAP_F_B,
    RECV_F,
    RESHARD,
    SEND_F,
    UNSHARD,
    Schedule1F1B,
    ScheduleDualPipeV,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleInterleavedZeroBubble,
    ScheduleLoopedBFS,
    ScheduleZBVZeroBubble,
)

from llmtrain.parallel.layout import layers_per_stage, stage_ids, stage_owner  # noqa: F401 (re-exported)

SCHEDULES = {
    "gpipe": ScheduleGPipe,
    "1f1b": Schedule1F1B,
    "interleaved_1f1b": ScheduleInterleaved1F1B,
    "looped_bfs": ScheduleLoopedBFS,
    "zero_bubble": ScheduleInterleavedZeroBubble,
    "zbv": ScheduleZBVZeroBubble,
    "dualpipe_v": ScheduleDualPipeV,
}


def make_stage_module(model: nn.Module, stage: int, layer_counts: list[int]) -> nn.Module:
    """A copy of `model` (meta device: free) holding only stage `stage`'s part."""
    part = copy.deepcopy(model)
    start = sum(layer_counts[:stage])
    keep = {str(i) for i in range(start, start + layer_counts[stage])}
    for key in list(part.layers.keys()):
        if key not in keep:
            del part.layers[key]
    last = stage == len(layer_counts) - 1
    if stage != 0:
        part.embed = None
    if not last:
        part.norm = None
        part.head = None
    elif stage != 0 and model.args.tie_embeddings:
        # The head's weight is tied to the embedding on stage 0: give this stage its own copy (same init,
        # gradients summed across the two holders every step; see ParallelModel.sync_tied_weights).
        part.head = nn.Linear(model.args.d_model, model.args.vocab_size, bias=False, device="meta")
    return part


def build_schedule(stages: list[PipelineStage], name: str, n_microbatches: int, loss_fn):
    for stage in stages:
        keep_inference_out_of_moe_stats(stage)
    cls = SCHEDULES[name]
    if name in ("gpipe", "1f1b"):
        return cls(stages[0], n_microbatches=n_microbatches, loss_fn=loss_fn)
    return cls(stages, n_microbatches=n_microbatches, loss_fn=loss_fn)


# The PipelineStage methods that run a stage's forward to learn its tensors' shapes and dtypes (on the first step,
# and again after each switch between evaluation and training): torch 2.13's, and older torch's.
SHAPE_INFERENCE = ("_forward_metadata_inference", "_shape_inference")
MOE_STATS = ("tokens_per_expert", "aux_sum", "z_sum", "calls")


def keep_inference_out_of_moe_stats(stage: PipelineStage) -> None:
    """A MoE block counts the tokens each expert gets over a step's forwards; the stage's shape inference is no
    micro-batch of the step, so its forward leaves those statistics as they were."""
    from llmtrain.model.moe import moe_modules

    blocks = moe_modules(stage.submod)
    for name in SHAPE_INFERENCE if blocks else ():
        infer = getattr(stage, name, None)
        if infer is not None:
            setattr(stage, name, functools.partial(_without_moe_stats, infer, blocks))


def _without_moe_stats(infer, blocks: list[nn.Module], *args, **kwargs):
    with torch.no_grad():
        kept = [[getattr(m, stat).clone() for stat in MOE_STATS] for m in blocks]
    try:
        return infer(*args, **kwargs)
    finally:
        with torch.no_grad():
            for m, values in zip(blocks, kept):
                for stat, value in zip(MOE_STATS, values):
                    getattr(m, stat).copy_(value)


FORWARD_ACTIONS = (FORWARD, SEND_F, RECV_F, UNSHARD, RESHARD)


def _forward_actions(actions: list) -> list:
    """A rank's actions, forward side only, in their order: an overlapped forward + backward keeps its forward."""
    kept = []
    for action in actions:
        if action.computation_type == OVERLAP_F_B and action.sub_actions is not None:
            kept.extend(a for a in action.sub_actions if a.computation_type in FORWARD_ACTIONS)
        elif action.computation_type in FORWARD_ACTIONS:
            kept.append(action)
    return kept


def evaluate_schedule(schedule, *args, **kwargs):
    """`schedule.eval(...)` for every schedule. The action-list schedules run their backward actions in eval too
    (as no-ops), and a V-shaped one hands each backward's input gradient to the stage before it on the same rank,
    which fails when nothing ran backward: run their forward actions alone (a subsequence of the training order,
    so the sends and receives still pair up)."""
    order = getattr(schedule, "pipeline_order_with_comms", None)
    if not order:
        return schedule.eval(*args, **kwargs)
    schedule.pipeline_order_with_comms = {rank: _forward_actions(actions) for rank, actions in order.items()}
    try:
        return schedule.eval(*args, **kwargs)
    finally:
        schedule.pipeline_order_with_comms = order
