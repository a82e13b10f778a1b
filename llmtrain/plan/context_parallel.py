"""What context parallel (`parallel.cp`) changes in a plan, from the config alone.

Each of the cp ranks of a group holds seq_len / cp tokens of every sample (two chunks of seq_len / (2 cp)), so
every activation term is the cp=1 term at seq_len / cp (local_config), except what attention keeps:
- without recompute, each layer keeps the keys and values all-gathered over the group (2 x b x seq_len x the k/v
  width / tp, the compute dtype) instead of its local ones, and the attention output twice: the per-chunk
  attention outputs the kernel saves, and the projection's input, a reshaped copy of their concatenation (at cp=1
  the kernel's output already has the projection's layout); on CPU each chunk whose keys reach past its queries
  also keeps its materialized causal mask (chunk_len x end fp32 values; the rank's two chunks end at (2 cp + 1)
  chunk lengths together);
- selective recompute wraps the whole attention core, gather included: it keeps the local q, k and v and the
  projection's input, as at cp=1 (at seq_len / cp), and gathers again in backward;
- full recompute keeps the block input (at seq_len / cp).
Parameters, gradients and optimizer state are ZeRO-sharded (or replicated) over dp_shard x cp ranks, and the
gradients are reduced over dp x cp: the state follows state_dims. Per layer and micro-batch the forward
all-gathers k and v (each rank receives (cp - 1) / cp of the whole), the backward reduce-scatters their gradients
(the same bytes), and any recompute gathers once more; attention waits for the gather, so it is exposed.
"""

from __future__ import annotations

from dataclasses import replace

from llmtrain.config.derived import DTYPE_BYTES
from llmtrain.parallel.layout import ParallelDims
from llmtrain.plan.params import block_shapes

FP32 = 4


def cp_of(cfg) -> int:
    return cfg.parallel.get("cp", 1)


def state_dims(dims: ParallelDims) -> ParallelDims:
    """The layout parameters, gradients and optimizer state follow: cp ranks join dp (and its ZeRO shard group)."""
    if dims.cp == 1:
        return dims
    return replace(dims, dp=dims.dp * dims.cp, dp_shard=dims.dp_shard * dims.cp if dims.zero else 1, cp=1)


def local_config(cfg):
    """`cfg` with model.seq_len the tokens of a sample one rank holds: what its activations are planned at."""
    cp = cp_of(cfg)
    if cp == 1:
        return cfg
    local = cfg.copy()
    local.model.seq_len = cfg.model.seq_len // cp
    local.parallel.cp = 1
    return local


def kv_bytes(cfg, micro_batch: int, layer: int) -> float:
    """The whole sequence's keys and values of one layer on one tensor-parallel rank, in the compute dtype."""
    shape = block_shapes(cfg.model)[layer]
    return 2.0 * micro_batch * cfg.model.seq_len * shape.kv / cfg.parallel.tp * DTYPE_BYTES[cfg.precision.compute_dtype]


def mask_bytes(cfg) -> float:
    """CPU: the materialized causal masks of a rank's two chunks (fp32 chunk_len x end each; rank 0's first chunk
    needs none, the other ranks' both do)."""
    chunk = cfg.model.seq_len // (2 * cp_of(cfg))
    return FP32 * chunk * (2 * cp_of(cfg) + 1) * chunk


def extra_layer_bytes(cfg, micro_batch: int, mode: str, layer: int, cuda: bool) -> float:
    """What block `layer` keeps under recompute `mode` beyond its cp=1 terms at seq_len / cp (module docstring)."""
    cp = cp_of(cfg)
    if cp == 1 or mode != "none":
        return 0.0
    m = cfg.model
    shape = block_shapes(m)[layer]
    size = DTYPE_BYTES[cfg.precision.compute_dtype]
    gathered = kv_bytes(cfg, micro_batch, layer)
    local_kv = gathered / cp
    output_copy = micro_batch * m.seq_len / cp * shape.attention / cfg.parallel.tp * size
    return gathered - local_kv + output_copy + (0.0 if cuda else mask_bytes(cfg))


def gather_bytes(cfg, layers: list[int], micro: int, recomputed: list[int]) -> float:
    """Bytes one rank receives per step in the k/v all-gathers and sends in their gradients' reduce-scatters, for
    its blocks `layers`; blocks `recomputed` (selective or full) gather once more in backward."""
    cp = cp_of(cfg)
    if cp == 1:
        return 0.0
    share = (cp - 1) / cp
    mb = cfg.train.micro_batch_size
    return micro * share * sum(kv_bytes(cfg, mb, i) * (3 if i in recomputed else 2) for i in layers)


def bandwidth(cfg, hw: dict) -> float:
    """Bytes/s of a cp group's links: one node's when every group sits inside a node (a group spans cp x pp x tp
    consecutive ranks), else the links between nodes."""
    p = cfg.parallel
    span = cp_of(cfg) * p.pp * p.tp
    inside = cfg.cluster.nnodes == 1 or cfg.cluster.nproc_per_node % span == 0
    return (hw["intra_node_gbs"] if inside else hw["inter_node_gbs"]) * 1e9
