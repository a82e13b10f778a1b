"""The numbers `llmtrain plan` reports, computed from the config alone (no process group, no GPU).

Parameter counts and FLOPs come from params.py (exact for every model family, per stage and rank; the tests compare
them with the real model); no torch import, so a plan takes well under a second. Memory follows the ZeRO paper for
model state (fp32 weights, gradients and two AdamW moments, sharded by zero level) and Korthikanti et al. 2022 for
activations, adjusted to what this trainer keeps on CPU in fp32 (measured with a saved-tensor hook): fused
attention (SDPA) stores no seq x seq matrix, its output is in the layout the projection reads (no reshaped copy)
and there are no dropout masks. In s*b*h elements, with r = n_heads x head_dim / d_model, r_kv the same for k/v
and f = the MLP width / d_model, a block keeps
- its norm inputs (2), and for Llama the normalized tensors too (2: torch's rms_norm is composite on CPU);
- the norm outputs, inputs of the column-parallel matmuls (2);
- q, k, v and the attention output (2 r + 2 r_kv; Llama's q and k after the rotation);
- GPT-2: the fc and GELU outputs (2 f); Llama (SwiGLU): the gate, SiLU, up and product outputs (4 f);
- Llama: the rotation's cos and sin (seq x head_dim each, independent of the batch);
- q/k norms (Qwen3, OLMoE): their inputs, normalized tensors and per-row scales;
- a sparse block (mixture of experts): instead of the MLP's, moe_memory.py's terms, whole on every tp rank.
GPT-2 keeps 16 s*b*h, llama-tiny (r 1, r_kv 1/2, f 2.75) 20. Under tensor parallel the first two groups are
replicated (sequence parallel shards the first), the rest are split. Selective recompute keeps as much (the
attention output it would drop is the projection's saved input too; only the softmax statistics go), full keeps
the block input only. Plus the loss's tensors (loss_bytes). The peak adds the pipeline runtime's buffers, one
backward temporary, under full recompute one block's activations rebuilt during its backward, and under TP one
all-reduce in flight. On a CUDA device under autocast (bf16/fp16) the memory follows cuda_memory.py instead, which
adds what autocast keeps (fp32 residual stream, cast copies of inputs and weights) and the loss's fp32 tensors.
Under expert parallel the routed experts' state and traffic follow their own layout (expert_parallel.py).
Step time is an estimate from stated assumptions (matmul efficiency, exposed communication), reported as such;
so is the MFU it implies, which exists only against a known peak (hw["peak_tflops"]: a CPU's step time is
estimated at its matmul speed measured now, which is no peak).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from llmtrain.config.derived import DTYPE_BYTES
from llmtrain.config.fp8 import float8_all_gather, float8_tensor_parallel, float8_weights_per_block
from llmtrain.config.schema import SINGLE_STAGE_SCHEDULES
from llmtrain.parallel import layout as pp_lib
from llmtrain.parallel.layout import ParallelDims
from llmtrain.plan import context_parallel as cp_lib
from llmtrain.plan import cuda_memory
from llmtrain.plan import expert_parallel as ep_lib
from llmtrain.plan.loss_memory import loss_memory, on_gpu, resolved_loss
from llmtrain.plan.moe_memory import moe_saved_bytes
from llmtrain.plan.params import (BlockShape, StagePlan, active_params, block_params_per_rank, block_shape,
                                  block_shapes, flops_per_token, moe_flops_per_token, stage_params)

__all__ = ["Plan", "StagePlan", "build_plan", "flops_per_token", "stage_params"]  # params.py's are re-exported

BYTES = DTYPE_BYTES
FP8 = 1


@dataclass
class Plan:
    params_total: int
    params_non_embedding: int
    params_active: int  # what one token runs through: = params_total without routed experts
    flops_per_token: float
    world_size: int
    dims: dict
    micro_batches: int
    stages: list[StagePlan]
    heaviest_stage: int
    peak_bytes_per_rank: float
    bubble_fraction: float
    comm_bytes_per_step: dict
    step_time_s: float
    tokens_per_s: float
    mfu: float | None  # None: no known peak (a CPU's, unless given)
    hardware: dict
    fits: bool
    notes: list[str]
    compute_s: float = 0.0  # of step_time_s: the FLOPs at the assumed efficiency, pipeline bubble included
    exposed_comm_s: float = 0.0  # of step_time_s: the communication not hidden behind compute
    # expert parallel: what the busiest pipeline rank's all-to-alls carry per step, and their time (exposed)
    all_to_all_bytes_per_step: float = 0.0
    all_to_all_s: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)


def saved_per_layer(model_cfg, layer: int = 0) -> tuple[float, float, float]:
    """What block `layer` keeps for backward on CPU, in s*b*h elements (see the module docstring): (norm inputs and
    intermediates: sharded by sequence parallel, the norm outputs: replicated under tensor parallel, the rest:
    split by tensor parallel). A sparse block's MoE keeps more: moe_memory.py."""
    shape = block_shape(model_cfg, layer)
    d = shape.d_model
    norms = 4.0 if shape.rms_norm else 2.0
    attention = (2 * shape.attention + 2 * shape.kv) / d
    if shape.qk_norm:  # q's and k's norm inputs, normalized tensors and per-row scales (composite rms_norm)
        rows = (shape.attention + shape.kv) // (shape.attention // model_cfg.n_heads) if shape.qk_norm == "head" \
            else 2
        attention += (2 * (shape.attention + shape.kv) + rows) / d
    mlp = 0.0 if shape.sparse else (4 if shape.gated else 2) * shape.ffn / d
    return norms, 2.0, attention + mlp


def rope_bytes(model_cfg, shape: BlockShape, size: int) -> float:
    """A rotary block keeps the rotation's cos and sin (seq x head_dim each, shared by q and k)."""
    return 2 * model_cfg.seq_len * (shape.attention // model_cfg.n_heads) * size if shape.rotary else 0.0


def activation_bytes_per_layer(cfg, micro_batch: int, mode: str | None = None, layer: int = 0) -> float:
    """Bytes block `layer` keeps for backward under recompute `mode` (default: the configured one). Selective
    recompute keeps as much as none: the attention output it would drop is the projection's saved input."""
    m, p = cfg.model, cfg.parallel
    sbh = m.seq_len * micro_batch * m.d_model
    size = BYTES[cfg.precision.compute_dtype]
    t = p.tp
    mode = mode or cfg.recompute.mode
    if mode == "full":
        return sbh * size / (t if p.sequence_parallel else 1)  # the block input only
    # Sequence parallel shards the norms' tensors; the column-parallel inputs are saved after DTensor's
    # all-gather, at full sequence length (Megatron re-gathers them in backward instead).
    shape = block_shape(m, layer)
    norms, column_inputs, split = saved_per_layer(m, layer)
    kept = norms / (t if p.sequence_parallel else 1) + column_inputs + split / t
    moe = moe_saved_bytes(m, shape, m.seq_len * micro_batch, size) if shape.sparse else 0.0
    return kept * sbh * size + moe + rope_bytes(m, shape, size)


def layer_bytes_by_layer(layer_bytes, cfg, micro_batch: int, mode: str | None = None) -> list[float]:
    """`layer_bytes` (this module's or cuda_memory's) of every block; blocks of one shape computed once."""
    out, seen = [], {}
    for i, shape in enumerate(block_shapes(cfg.model)):
        if shape not in seen:
            seen[shape] = layer_bytes(cfg, micro_batch, mode, i)
        out.append(seen[shape])
    return out


def in_flight(cfg, stage_rank: int, micro: int) -> float:
    """Micro-batches whose activations one pipeline rank holds at its peak."""
    p = cfg.parallel
    if p.pp == 1:
        return 1.0
    if p.pp_schedule == "gpipe":
        return float(micro)
    base = float(min(micro, p.pp - stage_rank))
    if p.pp_schedule not in SINGLE_STAGE_SCHEDULES:
        base *= 1 + (p.pp - 1) / (p.pp * p.virtual_stages)  # Narayanan et al. 2021, interleaved schedule
    return base


def float8_gather_saving(cfg, dims: ParallelDims, layers: int) -> float:
    """Bytes per rank FSDP2 gathers less for `layers` blocks under fp8's tensorwise recipe: the float8 layers'
    weights at 1 byte instead of the compute dtype's."""
    if not float8_all_gather(cfg, dims):
        return 0.0
    return layers * float8_weights_per_block(cfg) * (BYTES[cfg.precision.compute_dtype] - FP8)


def float8_flops_per_token(cfg) -> float:
    """Training FLOPs per token of the blocks' float8 matmuls (6 x their weights); 0 unless precision=fp8."""
    return 6.0 * cfg.model.n_layers * float8_weights_per_block(cfg) * cfg.parallel.tp


def state_bytes(cfg, dims: ParallelDims, params_per_rank: int, layers: int = 0, replica_copies: bool = True) -> dict:
    """fp32 parameters, fp32 gradients, two fp32 AdamW moments; ZeRO shards them over the dp_shard group.
    `layers`: the stage's blocks, whose float8 weights fp8 may gather in float8. `replica_copies`: count the
    unsharded copies FSDP2 makes under zero 0 (the CUDA model counts them as autocast's weight copies instead)."""
    shard = dims.dp_shard
    zero = dims.zero
    params = params_per_rank * 4 / (shard if zero == 3 else 1)
    grads = params_per_rank * 4 / (shard if zero >= 2 else 1)
    optim = params_per_rank * 8 / (shard if zero >= 2 else 1)
    # zero 2 and 3 shard the parameters at rest too (FSDP2); zero 2 keeps them gathered from forward to backward.
    if zero == 2:
        params = params_per_rank * 4 / shard
    compute = BYTES[cfg.precision.compute_dtype]
    whole = params_per_rank * compute - float8_gather_saving(cfg, dims, layers)
    if zero == 2 and dims.dp > 1 or zero == 0 and dims.dp > 1 and replica_copies:
        # FSDP2 also replicates (zero 0, a shard group of 1) through unsharded copies, kept forward to backward
        gathered = whole
    elif zero == 3 and dims.dp > 1:
        gathered = 2 * whole / max(1, cfg.model.n_layers)  # ~two blocks at a time
    else:
        gathered = 0.0
    return {"params": params, "grads": grads, "optimizer": optim, "gathered_params": gathered}


def stage_state_bytes(cfg, dims: ParallelDims, stage: StagePlan, replica_copies: bool = True) -> dict:
    """state_bytes of a stage's rank; under expert parallel its routed experts apart, in their own layout
    (expert_parallel.expert_dims; never float8)."""
    if dims.ep == 1 or not stage.expert_params_per_rank:
        return state_bytes(cfg, dims, stage.params_per_rank, len(stage.layers), replica_copies)
    rest = state_bytes(cfg, dims, stage.params_per_rank - stage.expert_params_per_rank, len(stage.layers),
                       replica_copies)
    experts = state_bytes(cfg, ep_lib.expert_dims(dims), stage.expert_params_per_rank, 0, replica_copies)
    return {k: rest[k] + experts[k] for k in rest}


def loss_bytes(cfg, micro_batch: int, gpu: bool = False) -> float:
    """The last stage's extra: the head's input (full: gathered under sequence parallel), the final norm's input (and
    for an RMSNorm family its normalized tensor), and what the loss keeps until backward (loss_memory.py: the fp32 log-softmax of
    one micro-batch, vocabulary-sharded under TP, or the chunked loss's gradients)."""
    m = cfg.model
    size = BYTES[cfg.precision.compute_dtype]
    tokens = micro_batch * m.seq_len
    sp = cfg.parallel.tp if cfg.parallel.sequence_parallel else 1  # the final norm runs on sequence shards
    head_input = tokens * m.d_model * size  # (the chunked loss keeps the hidden states' gradient instead)
    norm_input = tokens * m.d_model * size / sp
    if block_shape(m, m.n_layers - 1).rms_norm:
        norm_input *= 2  # and its normalized tensor
    return head_input + norm_input + loss_memory(cfg, micro_batch, gpu).saved


def pipeline_buffer_bytes(cfg, stage: int, n_stages: int, micro: int, boundary_size: int | None = None) -> float:
    """torch.distributed.pipelining allocates a receive buffer per micro-batch for each stage's input (all but the
    first stage) and for its output's gradient (all but the last), and the last stage keeps every micro-batch's
    output (each micro-batch's loss: a scalar, not counted) until the step ends."""
    if cfg.parallel.pp == 1:
        return 0.0
    m, p = cfg.model, cfg.parallel
    size = BYTES[cfg.precision.compute_dtype]
    boundary = (cfg.train.micro_batch_size * m.seq_len * m.d_model * (boundary_size or size)
                / (p.tp if p.sequence_parallel else 1))
    return micro * boundary * ((stage > 0) + (stage < n_stages - 1))


def backward_temporary_bytes(cfg, micro_batch: int) -> float:
    """The largest short-lived tensors of backward: the gradient of one layer's MLP hidden activation (s*b*f/t);
    SwiGLU's product backward makes two of them (the SiLU output's and the up projection's) from a third. A sparse
    block's: its routed copies' expert hidden (s*b*k*f, whole on every tensor-parallel rank)."""
    m = cfg.model
    tokens = m.seq_len * micro_batch

    def hidden(shape: BlockShape) -> float:
        if shape.sparse:
            return 2 * tokens * shape.top_k * shape.expert_ffn
        return tokens * shape.ffn / cfg.parallel.tp * (2 if shape.gated else 1)

    return max(hidden(s) for s in set(block_shapes(m))) * BYTES[cfg.precision.compute_dtype]


def tp_collective_bytes(cfg, micro_batch: int) -> float:
    """Tensor parallel's all-reduces are out-of-place functional collectives: while one is in flight its input and
    output (s*b*h each) are both alive, and when the input is freed depends on when the result is awaited."""
    m = cfg.model
    if cfg.parallel.tp == 1:
        return 0.0
    return 2 * m.seq_len * micro_batch * m.d_model * BYTES[cfg.precision.compute_dtype]


def dp_bytes(cfg, dims: ParallelDims, params: int, layers: int) -> float:
    """Data parallel's traffic per step per rank for `params` parameters held as `dims` lays them out."""
    if dims.dp == 1:
        return 0.0
    grad_bytes = params * BYTES[cfg.precision.reduce_dtype]
    if dims.zero == 0:
        return 2 * (dims.dp - 1) / dims.dp * grad_bytes  # ring all-reduce
    param_bytes = params * BYTES[cfg.precision.compute_dtype] - float8_gather_saving(cfg, dims, layers)
    n, gathers = dims.dp_shard, 2 if dims.zero == 3 else 1
    return (gathers * (n - 1) / n * param_bytes + (n - 1) / n * grad_bytes
            + (2 * (dims.dp_replicate - 1) / dims.dp_replicate * grad_bytes / n if dims.dp_replicate > 1 else 0.0))


def comm_bytes(cfg, dims: ParallelDims, plan_stage: StagePlan, micro: int) -> dict:
    """Traffic per step per rank (`plan_stage`'s) of dp, tp and pp; under expert parallel the routed experts'
    gradients and gathers run over the ranks holding the same experts (the all-to-alls: expert_parallel.py)."""
    m, p = cfg.model, cfg.parallel
    mb = cfg.train.micro_batch_size
    act = BYTES[cfg.precision.compute_dtype] * m.seq_len * mb * m.d_model
    out = {"dp": 0.0, "tp": 0.0, "pp": 0.0}
    experts = plan_stage.expert_params_per_rank if dims.ep > 1 else 0
    out["dp"] = dp_bytes(cfg, dims, plan_stage.params_per_rank - experts, len(plan_stage.layers))
    if experts:
        out["dp"] += dp_bytes(cfg, ep_lib.expert_dims(dims), experts, 0)
    if p.tp > 1:
        # 2 all-reduces forward + 2 backward per layer per micro-batch (or the same volume as AG + RS with SP).
        per_layer = 4 * 2 * (p.tp - 1) / p.tp * act
        if float8_tensor_parallel(cfg) and p.sequence_parallel:
            per_layer *= (1 + FP8 / BYTES[cfg.precision.compute_dtype]) / 2  # fp8: both all-gathers in float8
        # A sparse block's MoE is computed whole: only attention's all-reduce each way, and under sequence
        # parallel the MoE input's all-gather forward and its output gradient's backward.
        sparse_layer = 2 * 2 * (p.tp - 1) / p.tp * act + (2 * (p.tp - 1) / p.tp * act if p.sequence_parallel else 0)
        shapes = block_shapes(m)
        out["tp"] = sum(sparse_layer if shapes[i].sparse else per_layer for i in plan_stage.layers) * micro
    if p.pp > 1:
        out["pp"] = 2 * act / p.tp * micro  # activations forward, their gradients backward, per boundary
    return out


def build_plan(cfg, peak_flops: float, memory_bytes: float | None, hw: dict) -> Plan:
    dims = ParallelDims.from_config(cfg)
    # Context parallel: the state follows dp x cp ranks, the activations a rank's seq_len / cp tokens
    # (context_parallel.py); `local` is the config with that sequence length.
    sdims, local = cp_lib.state_dims(dims), cp_lib.local_config(cfg)
    t, p = cfg.train, cfg.parallel
    micro = t.global_batch_size // (t.micro_batch_size * dims.dp)
    stages, total, non_embedding = stage_params(cfg)
    cuda = cuda_memory.applies(cfg, hw)
    gpu = on_gpu(cfg, hw["name"])  # (fp32 on a GPU is planned with the CPU model, its loss resolved for the GPU)
    local_layer_bytes = cuda_memory.layer_bytes if cuda else activation_bytes_per_layer

    def layer_bytes(c, mb, mode=None, layer=0):
        return (local_layer_bytes(local, mb, mode, layer)
                + cp_lib.extra_layer_bytes(cfg, mb, mode or cfg.recompute.mode, layer, cuda))
    per_layer = layer_bytes_by_layer(layer_bytes, cfg, t.micro_batch_size)
    full_layer = layer_bytes_by_layer(layer_bytes, cfg, t.micro_batch_size, "none")
    block_per_rank = [block_params_per_rank(shape, cfg.model, p.tp, dims.ep) for shape in block_shapes(cfg.model)]
    every = cfg.recompute.every
    notes = []
    ranks_stages = {r: pp_lib.stage_ids(r, p.pp, p.virtual_stages, p.pp_schedule) for r in range(p.pp)} \
        if p.pp > 1 else {0: [0]}
    recomputed, held_copies = {}, {}
    for s in stages:
        owner = next(r for r, ids in ranks_stages.items() if s.stage in ids)
        s.in_flight = in_flight(cfg, owner, micro)
        # recompute.every=N recomputes only the blocks whose global index is a multiple of N.
        recomputed[s.stage] = [i for i in s.layers if cfg.recompute.mode != "none" and i % every == 0]
        s.activation_bytes = sum(per_layer[i] if i in recomputed[s.stage] else full_layer[i] for i in s.layers
                                 ) * s.in_flight
        if cuda:
            saved, held_copies[s.stage] = cuda_memory.weight_copies(cfg, sdims, s, recomputed[s.stage], block_per_rank)
            s.activation_bytes += saved
        if s.stage == len(stages) - 1:  # each micro-batch in flight keeps its own
            loss_saved = cuda_memory.loss_saved_bytes(local, t.micro_batch_size) if cuda else \
                loss_bytes(local, t.micro_batch_size, gpu)
            s.activation_bytes += loss_saved * s.in_flight
        s.state_bytes = stage_state_bytes(cfg, sdims, s, replica_copies=not cuda)
    # A rank's peak, at the start of the last micro-batch's backward: model state, live activations, the
    # pipeline runtime's buffers and one backward temporary. Without accumulation no gradient exists yet then,
    # and backward frees each layer's activations as it makes that layer's gradients: the larger of the two counts.
    # Backward of a recomputed block holds that block's activations again while it runs (on CUDA with its weights'
    # copies made again, when only autocast's cache had held them).
    rework = max(full_layer[i] - per_layer[i] + (cuda_memory.cached_only_bytes(cfg, sdims, [i], block_per_rank)
                                                 if cuda else 0.0) for i in range(cfg.model.n_layers)) \
        if cfg.recompute.mode != "none" else 0.0
    transient = (backward_temporary_bytes(local, t.micro_batch_size) + rework
                 + tp_collective_bytes(local, t.micro_batch_size))
    if cuda:
        transient += cuda_memory.float8_transient_bytes(local, t.micro_batch_size)
    boundary = cuda_memory.boundary_bytes_per_element() if cuda else None
    rank_peaks = {}
    for r, ids in ranks_stages.items():
        held = [stages[i] for i in ids]
        state = sum(s.state_bytes["params"] + s.state_bytes["optimizer"] + s.state_bytes["gathered_params"]
                    for s in held)
        grads = sum(s.state_bytes["grads"] for s in held)
        acts = sum(s.activation_bytes + pipeline_buffer_bytes(local, s.stage, len(stages), micro, boundary)
                   for s in held)
        if cuda:
            moments = cuda_memory.moments(local, sdims, held, len(stages), micro, state, grads, acts, transient,
                                          sum(held_copies[s.stage] for s in held),
                                          sum(cuda_memory.cached_only_bytes(cfg, sdims, recomputed[s.stage],
                                                                            block_per_rank) for s in held))
            rank_peaks[r] = max(moments.values())
        else:
            live = grads + acts if micro > 1 else max(grads, acts)  # a pipeline always has micro > 1
            # The loss's own short-lived tensors come before the blocks' backward, with every activation alive.
            loss = loss_memory(local, t.micro_batch_size, gpu) if any(s.stage == len(stages) - 1
                                                                              for s in held) else None
            rank_peaks[r] = state + live + (max(transient, loss.forward, loss.backward) if loss else transient)
        for s in held:
            s.peak_bytes = rank_peaks[r]
    heaviest_rank = max(rank_peaks, key=rank_peaks.get)
    heaviest = ranks_stages[heaviest_rank][0]
    peak = rank_peaks[heaviest_rank]

    fpt = flops_per_token(cfg, non_embedding)
    tokens = t.global_batch_size * cfg.model.seq_len
    world = dims.world_size
    recompute_factor = {"none": 1.0, "selective": 1.0 + 0.05, "full": 4.0 / 3.0}[cfg.recompute.mode]
    if cfg.recompute.mode == "full" and cfg.recompute.every > 1:
        recompute_factor = 1.0 + (1.0 / 3.0) / cfg.recompute.every
    # precision=fp8: the blocks' float8 matmuls at the float8 peak (when the hardware has one), the rest as before.
    float8_fpt, float8_peak = float8_flops_per_token(cfg), hw.get("peaks", {}).get("float8")
    if not float8_peak:
        float8_fpt, float8_peak = 0.0, 1.0
    flop_s = (fpt - float8_fpt) / peak_flops + float8_fpt / (float8_peak * 1e12)  # seconds per token's FLOPs
    # Tensor parallel computes a sparse block's MoE whole on every rank: (tp - 1) more copies of its FLOPs.
    flop_s += (p.tp - 1) * moe_flops_per_token(cfg.model) / peak_flops
    compute_s = flop_s * tokens / world * recompute_factor / hw["efficiency"]
    bubble = (p.pp - 1) / (p.virtual_stages * micro + p.pp - 1) if p.pp > 1 else 0.0
    comm = comm_bytes(local, sdims, stages[heaviest], micro)
    if dims.cp > 1:  # the heaviest pipeline rank's k/v all-gathers and reduce-scatters
        comm["cp"] = max(cp_lib.gather_bytes(cfg, [i for k in ids for i in stages[k].layers], micro,
                                             [i for k in ids for i in recomputed[k]]) for ids in ranks_stages.values())
    intra, inter = hw["intra_node_gbs"] * 1e9, hw["inter_node_gbs"] * 1e9
    tp_bw = intra if p.tp <= cfg.cluster.nproc_per_node else inter
    dp_bw = inter if cfg.cluster.nnodes > 1 else intra
    # Expert parallel's all-to-alls sit on the critical path (the experts wait for their tokens): the busiest
    # pipeline rank's, the share of them that leaves the rank.
    a2a = max(ep_lib.all_to_all_bytes(cfg, [i for k in ids for i in stages[k].layers], micro,
                                      [i for k in ids for i in recomputed[k]]) for ids in ranks_stages.values())
    a2a_s = a2a * ep_lib.leaving_share(dims.ep) / ep_lib.all_to_all_bandwidth(cfg, hw) * hw.get("comm_factor", 1.0)
    # TP and PP transfers sit on the critical path; DP overlaps with backward except ~1/L of it.
    exposed = comm["tp"] / tp_bw + comm["pp"] / tp_bw + comm["dp"] / dp_bw / max(1, cfg.model.n_layers)
    exposed += comm.get("cp", 0.0) / cp_lib.bandwidth(cfg, hw)  # attention waits for its keys and values
    exposed *= hw.get("comm_factor", 1.0)  # 1 unless `llmtrain tune` measured otherwise (plan/calibration.py)
    exposed += a2a_s
    step = compute_s / (1 - bubble) + exposed
    tps = tokens / step
    mfu = fpt * tps / (peak_flops * world) if hw.get("peak_tflops") is not None else None
    fits = memory_bytes is None or peak <= memory_bytes
    if memory_bytes is None:
        notes.append("device memory unknown: fit not checked")
    if cuda:
        notes.append("memory: CUDA autocast model (fp32 residual stream, cast copies of inputs and weights, the "
                     f"{resolved_loss(cfg, gpu)} loss's tensors); peak = the largest of forward end, loss forward, "
                     "loss backward, blocks' backward and optimizer step")
    of = "of peak" if mfu is not None else f"of this CPU's matmul speed measured now ({peak_flops / 1e12:.3g} TFLOPS)"
    if hw.get("calibration"):
        notes.append(f"step time {hw['calibration']}: matmuls at {hw['efficiency']:.1%} {of}, "
                     f"{hw['comm_factor']:.2f}x the exposed communication of the uncalibrated estimate")
    else:
        notes.append(f"step time assumes matmuls at {hw['efficiency']:.0%} {of}, TP/PP transfers exposed, "
                     "DP overlapped with backward")
    if float8_fpt:
        notes.append(f"fp8: the blocks' float8 matmuls ({float8_fpt / fpt:.0%} of the FLOPs) at the float8 peak "
                     f"({float8_peak:,.0f} TFLOPS), the rest at the {cfg.precision.compute_dtype} peak; float8 "
                     "scaling and casts (memory-bound; train.compile fuses them) are not counted, so the speed-up "
                     f"is an upper bound; MFU is against the {cfg.precision.compute_dtype} peak")
    if p.tp > 1 and moe_flops_per_token(cfg.model):
        notes.append(f"tensor parallel computes the MoE blocks whole on each of the {p.tp} ranks: their FLOPs "
                     f"({moe_flops_per_token(cfg.model) / fpt:.0%} of the model's) take {p.tp}x the time, not counted "
                     "as model FLOPs (MFU)")
    if dims.ep > 1:
        notes.append(f"expert parallel: each rank holds 1/{dims.ep} of every sparse layer's routed experts, "
                     f"replicated or ZeRO-sharded over the {dims.expert_dp} rank(s) holding the same ones; its expert "
                     "activations are those of the token-expert pairs it receives, on average its own tokens x top_k "
                     f"(a balanced router), as at ep=1; the {dims.ep - 1}/{dims.ep} of the all-to-alls that leaves "
                     "the rank is counted exposed")
    return Plan(params_total=total, params_non_embedding=non_embedding, params_active=active_params(cfg, total),
                flops_per_token=fpt, world_size=world,
                dims={"dp": dims.dp, "dp_shard": dims.dp_shard, "cp": dims.cp, "tp": p.tp, "pp": p.pp, "ep": dims.ep,
                      "virtual_stages": p.virtual_stages, "zero": dims.zero, "schedule": p.pp_schedule,
                      "recompute": cfg.recompute.mode, "recompute_every": cfg.recompute.every,
                      "sequence_parallel": p.sequence_parallel, "micro_batch_size": t.micro_batch_size},
                micro_batches=micro, stages=stages, heaviest_stage=heaviest, peak_bytes_per_rank=peak,
                bubble_fraction=bubble, comm_bytes_per_step=comm, step_time_s=step, tokens_per_s=tps,
                mfu=mfu, hardware=hw, fits=fits, notes=notes, compute_s=compute_s / (1 - bubble),
                exposed_comm_s=exposed, all_to_all_bytes_per_step=a2a, all_to_all_s=a2a_s)

