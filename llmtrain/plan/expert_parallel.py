"""What expert parallel (`parallel.ep`) changes in a plan, from the config alone.

Each group of ep consecutive data-parallel ranks (same pipeline and tensor-parallel coordinates) splits every
sparse block's routed experts: a rank holds E / ep of them (params.py counts them per rank). Those are replicated
(zero 0) or ZeRO-sharded (zero 2/3) over the expert_dp = dp / ep ranks that hold the same experts, in shard groups
of expert_dp_shard = dp_shard / ep; everything else keeps its dp layout. A rank's expert activations are those of
the token-expert pairs it receives: with a balanced router, on average its own tokens x top_k, as at ep = 1, so the
activation terms do not change.

Per sparse block and micro-batch, forward: an all-to-all of the per-expert token counts (E int64 values), then one
of the routed pairs' hidden states (tokens x top_k rows of d_model values in the compute dtype) to their experts'
ranks and one back with the experts' outputs (the same size); backward: the two big ones again, with gradients;
full recompute runs the forward ones once more. A rank's tokens are its micro-batch's, whole under tensor
parallel (each tp rank computes the block whole and dispatches to its own ep peers). Of what each all-to-all
carries, on average (ep - 1) / ep leaves the rank: the rest is the rank's own experts' share.
"""

from __future__ import annotations

from llmtrain.config.derived import DTYPE_BYTES
from llmtrain.parallel.layout import ParallelDims
from llmtrain.plan.params import BlockShape, block_shapes

INT64 = 8


def expert_dims(dims: ParallelDims) -> ParallelDims:
    """The layout the routed experts are replicated or ZeRO-sharded in: over expert_dp ranks, in shard groups of
    expert_dp_shard."""
    return ParallelDims(dp=dims.expert_dp, tp=dims.tp, pp=dims.pp, dp_shard=dims.expert_dp_shard, zero=dims.zero)


def layer_all_to_all_bytes(shape: BlockShape, tokens: int, size: int, recomputed: bool) -> float:
    """Bytes one sparse block's all-to-alls carry on one rank for one micro-batch of `tokens` (forward: the counts
    and the two of routed rows; backward: the two of gradients; full recompute: the forward ones again)."""
    rows = tokens * shape.top_k * shape.d_model * size
    forward = shape.experts * INT64 + 2 * rows
    return forward + 2 * rows + (forward if recomputed else 0.0)


def all_to_all_bytes(cfg, layers: list[int], micro: int, recomputed: list[int]) -> float:
    """Bytes one rank's all-to-alls carry per step: every sparse block of `layers` (the rank's stages), every
    micro-batch; `recomputed`: the blocks full recompute re-runs. 0 without expert parallel."""
    if cfg.parallel.get("ep", 1) == 1:
        return 0.0
    shapes = block_shapes(cfg.model)
    tokens = cfg.train.micro_batch_size * cfg.model.seq_len
    size = DTYPE_BYTES[cfg.precision.compute_dtype]
    full = cfg.recompute.mode == "full"
    return micro * sum(layer_all_to_all_bytes(shapes[i], tokens, size, full and i in recomputed)
                       for i in layers if shapes[i].sparse)


def leaving_share(ep: int) -> float:
    """What leaves the rank of an all-to-all over ep ranks, with a balanced router."""
    return (ep - 1) / ep


def all_to_all_bandwidth(cfg, hw: dict) -> float:
    """Bytes/s of an ep group's links: one node's when every group sits inside a node (a group spans
    ep x pp x tp consecutive ranks), else the links between nodes."""
    p = cfg.parallel
    span = p.get("ep", 1) * p.pp * p.tp
    inside = cfg.cluster.nproc_per_node % span == 0
    return (hw["intra_node_gbs"] if inside else hw["inter_node_gbs"]) * 1e9
