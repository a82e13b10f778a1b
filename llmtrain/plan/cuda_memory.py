"""Per-rank memory of a CUDA run under autocast (precision bf16 or fp16): what differs from the CPU model.

Under torch.autocast only the matmuls (and fused attention) run in the compute dtype, on cast copies of their
inputs; embeddings, LayerNorm and the residual adds stay fp32, so the residual stream is fp32. What one
transformer block keeps for backward, per s*b*h (s*b*h*c bytes, c = 2), with r = attention width / d_model:

- eager: both LayerNorm inputs (fp32, 2 x 4 bytes); LN1's output cast to the compute dtype once per q/k/v
  projection (autocast caches casts of weights only: three copies) and LN2's output cast once (4 c); q, k, v and
  the attention output (4 r c: flash attention returns its output in the layout the projection reads, so the
  projection saves a view of it); the fc output and the GELU output (8 c);
- train.compile: inductor casts LN1's output once, and keeps the attention projection's output (c) instead of the
  fp32 residual sum that LN2 reads (it adds the sum again in backward): 4 + 4 c + (4 r + 8) c;
- recompute full: the block's fp32 input; selective: as none (the attention output stays alive as the
  projection's input, so only the softmax statistics are dropped).

Llama's block by the same rules, with r_kv = n_kv_heads x head_dim / d_model and f = the MLP
width / d_model: the RMSNorm inputs (fp32, 2 x 4 bytes; CUDA's fused rms_norm keeps its input and the per-row
scale, not its output, unlike the composite one on CPU), LN1's output cast three times and LN2's twice (gate and
up: 5 c); q and k after the rotation, v and the attention output ((2 r + 2 r_kv) c; the rotation itself keeps only
its compute-dtype cos and sin, cast for q and again for k: 4 x seq x head_dim x c, any batch); SwiGLU's gate, SiLU,
up and product outputs (4 f c). Under train.compile Llama's block is planned with its eager terms (the compile
terms were measured on GPT-2's). These terms follow autocast's rules and the kernels' saved tensors; they have not
been measured on a GPU.

Each matmul also saves the compute-dtype copy of its weight that autocast made: a copy of the stage's weights is
alive from forward through backward. Without a pipeline, autocast is left when the forward ends, so under full
recompute only autograd holds copies (of the blocks not recomputed and of the head); a pipeline schedule runs
inside one autocast context, whose cache keeps every copy for the whole step. Under FSDP the parameters are
gathered in the compute dtype (the gathered term of the state); zero 0 keeps them from forward to backward.

The model returns the loss, not the logits; what the loss holds depends on train.loss (loss_memory.py: the full
logits' fp32 log_softmax and its two backward tensors, or the chunked/fused loss's kept gradients and one chunk).
The peak is the largest of five moments of the last micro-batch: the end of its forward, the loss's forward, the
start of its backward (the loss), during the blocks' backward, and the optimizer step
(fp32 gradients, AdamW moments and the update's temporaries). The caching allocator rounds each block to 512
bytes, which is negligible at these sizes and not modelled.

Qwen3's and OLMoE's q/k norms run in fp32 under autocast and keep their fp32 inputs ((r + r_kv) x 4 bytes). A
sparse block (mixture of experts) keeps moe_memory.py's terms at the compute dtype, with autocast's changes: its
input stays fp32, so the router keeps a compute-dtype cast of it, each expert's gate and up matmuls one cast each
of their routed copies and the shared experts' gate and up one each; the router's softmax and logsumexp run in
fp32. The MoE is whole on every tensor-parallel rank (not divided by tp). These terms match what one block saves
under CPU autocast; unmeasured on a GPU are all of them: the q/k norms', the MoE's, the compute-dtype copies of
the expert weights (planned like every block weight's), torch._grouped_mm's workspace, and how the caching
allocator packs the experts' tensors of uneven sizes (the tokens each expert gets change every step).

precision=fp8 (torchao Float8Linear in the blocks, bf16 autocast elsewhere) differs in three places. A float8 layer
casts its weight to float8 inside each matmul and saves the weight it was given, so without FSDP no bf16 copy of
the blocks' weights exists (the head's remains); the float8 copies of the largest matmul's weight, input and
output gradient (1 byte each) are alive during its backward. It saves its input in bf16, as autocast does, except
under torchao's float8 tensor-parallel styles (tensorwise, tp > 1), which cast each block input once before its
all-gather and the row-parallel inputs before their matmul: LN1's and LN2's outputs are kept as one float8 copy
each, the attention output as a float8 copy besides the one attention keeps, and the GELU output in float8 only.
FSDP2 all-gathers tensorwise weights in float8 (estimate.py). Under train.compile inductor may save float8 casts
instead of bf16 inputs; that is not modelled (the eager terms are used).
"""

from __future__ import annotations

from llmtrain.config.derived import DTYPE_BYTES, padded_vocab_size
from llmtrain.config.fp8 import float8_tensor_parallel, float8_weights_per_block
from llmtrain.plan.loss_memory import loss_memory
from llmtrain.plan.moe_memory import moe_saved_bytes
from llmtrain.parallel.layout import ParallelDims
from llmtrain.plan.params import BlockShape, StagePlan, block_shape, block_shapes, embedding_params

FP32 = 4
FP8 = 1
SIZES = DTYPE_BYTES


def applies(cfg, hw: dict) -> bool:
    """This model is for a CUDA device under autocast: device=cuda, or device=auto with a GPU hardware profile."""
    autocast = cfg.precision.compute_dtype != "float32" and not cfg.precision.name.startswith("apex-")
    cuda = cfg.device == "cuda" or (cfg.device == "auto" and hw["name"] != "cpu")
    return autocast and cuda


def _compute_size(cfg) -> int:
    return SIZES[cfg.precision.compute_dtype]


def compile_terms_measured(shape: BlockShape) -> bool:
    """train.compile's terms were measured on GPT-2's block (LayerNorm, GELU MLP, no rotation); others use eager's."""
    return not (shape.gated or shape.rms_norm or shape.rotary or shape.qk_norm or shape.sparse)


def layer_bytes(cfg, micro_batch: int, mode: str | None = None, layer: int = 0) -> float:
    """Bytes autograd saves for block `layer` under recompute `mode` (default: the configured one), weights
    excluded."""
    m, p = cfg.model, cfg.parallel
    sbh = m.seq_len * micro_batch * m.d_model
    c, t = _compute_size(cfg), p.tp
    sp = t if p.sequence_parallel else 1  # sequence parallel shards what the norms and the residual touch
    mode = mode or cfg.recompute.mode
    if mode == "full":
        return FP32 * sbh / sp
    shape = block_shape(m, layer)
    r = shape.attention / m.d_model
    attention = (2 * shape.attention + 2 * shape.kv) / m.d_model  # q, k, v and the attention output
    hidden = 0.0 if shape.sparse else shape.ffn / m.d_model
    mlp = (4 if shape.gated else 2) * hidden  # fc and GELU outputs; SwiGLU: gate, SiLU, up and product outputs
    split = (attention + mlp) * c / t  # head- or hidden-sharded under tensor parallel
    casts = 3 + (0 if shape.sparse else shape.mlp_in_matrices)  # norm outputs cast once per matmul that reads them
    # a sparse block's MoE, whole on every tensor-parallel rank (moe_memory.py)
    moe = moe_saved_bytes(m, shape, m.seq_len * micro_batch, c, autocast=True) if shape.sparse else 0.0
    # rotary: the rotation casts cos and sin (seq x head_dim) to the compute dtype for q and for k; the products
    # save them
    rope = 4 * m.seq_len * (shape.attention // m.n_heads) * c if shape.rotary else 0.0
    if float8_tensor_parallel(cfg):  # one float8 cast of each norm output; float8 copies of the row-parallel inputs
        replicated = 2 * FP32 / sp + 2 * FP8
        split = (attention * c + r * FP8 + (mlp - hidden) * c + hidden * FP8) / t
    elif cfg.train.compile and compile_terms_measured(shape):  # measured for GPT-2's block only; eager otherwise
        replicated = FP32 / sp + c + c / sp + c  # LN1 input, its one cast, attention projection output, LN2 cast
    else:
        replicated = 2 * FP32 / sp + casts * c  # norm inputs and the casts of their outputs
    if shape.qk_norm:  # the q and k norms run in fp32 and keep their fp32 inputs
        split += (shape.attention + shape.kv) / m.d_model * FP32 / t
    return (replicated + split) * sbh + rope + moe


def copied_block_params(cfg, dims, block_per_rank: int) -> int:
    """Parameters of one block that autocast copies to the compute dtype: all but, without FSDP, the float8
    layers' weights (FSDP's compute-dtype parameters are what every layer is given, float8 or not)."""
    return block_per_rank - (float8_weights_per_block(cfg) if dims.dp == 1 else 0)


def weight_copies(cfg, dims, stage, recomputed: list[int], block_per_rank: list[int]) -> tuple[float, float]:
    """(bytes of compute-dtype weight copies autograd saves, bytes of copies held otherwise at the backward peak)
    for one stage; its blocks `recomputed` (global indices) run under full recompute; `block_per_rank`: every
    block's parameters on one tensor-parallel rank, by layer."""
    if dims.dp > 1 and dims.zero >= 2:
        return 0.0, 0.0  # FSDP's gathered compute-dtype parameters: counted in the state
    c = _compute_size(cfg)
    m, tp = cfg.model, cfg.parallel.tp
    copied = {i: copied_block_params(cfg, dims, block_per_rank[i]) for i in stage.layers}
    cast = stage.params_per_rank - sum(block_per_rank[i] - copied[i] for i in stage.layers)  # float8: no copy
    if stage.stage == 0:  # the embeddings are looked up in fp32; only a head (last stage) is a matmul
        tok, pos, untied_head = embedding_params(m)
        cast -= pos
        if untied_head or stage.stage != cfg.parallel.pp * cfg.parallel.virtual_stages - 1:
            cast -= tok // tp
    whole = cast * c
    dropped = sum(copied[i] for i in recomputed) * c if cfg.recompute.mode == "full" else 0.0
    # A pipeline's autocast cache, or FSDP's unsharded parameters (zero 0), keep the copies autograd does not.
    held = dropped if (cfg.parallel.pp > 1 or dims.dp > 1) else 0.0
    return whole - dropped, held


def cached_only_bytes(cfg, dims, recomputed: list[int], block_per_rank: list[int]) -> float:
    """Copies of the recomputed blocks' weights (global indices) that only autocast's cache holds: alive until the
    forward ends."""
    if cfg.recompute.mode != "full" or cfg.parallel.pp > 1 or dims.dp > 1:
        return 0.0
    return sum(copied_block_params(cfg, dims, block_per_rank[i]) for i in recomputed) * _compute_size(cfg)


def float8_transient_bytes(cfg, micro_batch: int) -> float:
    """precision=fp8: the float8 copies of the largest block matmul's (an MLP input matrix's) weight, input and
    output gradient, alive during its backward; 0 otherwise."""
    if cfg.precision.name != "fp8":
        return 0.0
    m, t = cfg.model, cfg.parallel.tp
    sbh = m.seq_len * micro_batch * m.d_model
    hidden = block_shape(m).ffn / m.d_model
    return FP8 * (hidden * m.d_model * m.d_model / t + sbh + hidden * sbh / t)


def loss_saved_bytes(cfg, micro_batch: int) -> float:
    """What the last stage saves after the blocks: the final norm's fp32 input, the head's cast input (the chunked
    loss keeps the hidden states' gradient instead, the same size) and what the loss keeps (loss_memory.py)."""
    head_inputs = micro_batch * cfg.model.seq_len * cfg.model.d_model * (FP32 + _compute_size(cfg))
    return head_inputs + loss_memory(cfg, micro_batch, gpu=True).saved


def boundary_bytes_per_element() -> int:
    """A pipeline stage sends the residual stream, which autocast leaves in fp32."""
    return FP32


def optimizer_step_bytes(cfg, largest_param: float) -> float:
    """Temporaries of the update: single-tensor AdamW builds sqrt(v) and its quotient (two fp32 tensors of the
    parameter's size); the fused kernels none."""
    fused = cfg.optim.fused in ("auto", "torch", "apex")  # auto is torch's fused kernel on CUDA
    return 0.0 if fused else 2 * FP32 * largest_param


def rank_peak(*, state: float, grads: float, acts: float, micro: int, last: bool, held_weights: float,
              cached_only: float, loss_output: float, loss_forward: float, loss_backward: float,
              block_transient: float, optimizer_temporaries: float) -> dict:
    """The moments of the step (see the module docstring), in bytes; the peak is their maximum. `loss_output` is
    what the loss keeps from its forward to the start of backward (the model returns the loss, not the logits)."""
    accumulated = grads if micro > 1 else 0.0  # gradients of the earlier micro-batches
    live = grads + acts if micro > 1 else max(grads, acts)  # backward frees activations as it makes gradients
    before_loss = loss_output if last else 0.0
    forward_end = state + accumulated + acts - before_loss + held_weights + cached_only
    return {
        "forward_end": forward_end,
        "loss_forward": forward_end + (loss_output + loss_forward if last else 0.0),
        "loss_backward": state + live + held_weights + (loss_backward if last else 0.0),
        "blocks_backward": state + live - before_loss + held_weights + block_transient,
        "optimizer_step": state + grads + optimizer_temporaries,
    }


def largest_block_param(shape: BlockShape, tp: int, ep: int = 1) -> float:
    """Elements of one block's largest parameter on a tensor-parallel rank: an MLP matrix (split), or a sparse
    block's experts' stacked matrices (the rank's E / ep experts, whole)."""
    if shape.sparse:
        return float(shape.experts // ep * shape.expert_ffn * shape.d_model)
    return shape.ffn * shape.d_model / tp


def moments(cfg, dims: ParallelDims, held: list[StagePlan], n_stages: int, micro: int, state: float,
            grads: float, acts: float, block_transient: float, held_weights: float, cached_only: float) -> dict:
    """One rank's memory at the four moments rank_peak describes."""
    mb = cfg.train.micro_batch_size
    m, tp = cfg.model, cfg.parallel.tp
    holds_embedding = any(s.stage in (0, n_stages - 1) for s in held)
    shapes = block_shapes(m)

    def shard(sparse: bool) -> int:  # the optimizer updates its shard (the routed experts': over expert_dp_shard)
        return 1 if dims.zero < 2 else dims.expert_dp_shard if sparse and dims.ep > 1 else dims.dp_shard

    largest = max(largest_block_param(shapes[i], tp, dims.ep) / shard(shapes[i].sparse) for s in held
                  for i in s.layers) if any(s.layers for s in held) else 0.0
    if holds_embedding:
        largest = max(largest, padded_vocab_size(m) * m.d_model / tp / shard(False))
    loss = loss_memory(cfg, mb, gpu=True)
    return rank_peak(
        state=state, grads=grads, acts=acts, micro=micro, last=any(s.stage == n_stages - 1 for s in held),
        held_weights=held_weights, cached_only=cached_only, loss_output=loss.saved, loss_forward=loss.forward,
        loss_backward=loss.backward, block_transient=block_transient,
        optimizer_temporaries=optimizer_step_bytes(cfg, largest))
