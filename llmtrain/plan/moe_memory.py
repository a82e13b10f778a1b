"""What a sparse block's mixture of experts (llmtrain/model/moe/) keeps for backward, for a batch of `tokens`.

Tensor parallel computes it whole on every rank, so none of it is divided by tp. Besides its input (the second
norm's output, which the planner counts with the other matmul inputs) autograd keeps:
- the router's fp32 probabilities (tokens x experts; softmax's output, or sigmoid's), and its fp32 logits too while
  an auxiliary loss is on (the z-loss's logsumexp keeps them);
- the chosen experts' routing weights (fp32, tokens x k; twice when norm_topk_prob renormalizes them) and three
  int64 index tensors of tokens x k (the chosen experts, the sorted pairs' tokens, the combine's inverse order);
- the top_k routed copies of the tokens, sorted by expert (tokens x k x d): the experts' gate and up input;
- each routed copy's SwiGLU gate, SiLU, up and product outputs (4 x tokens x k x expert width);
- the experts' outputs in token order, which the combine weighs (tokens x k x d);
- the shared experts' SwiGLU (4 x tokens x their width; their input is the norm output again).
Under autocast (cuda_memory.py) the input stays fp32 (the residual stream's norm output), so the router's matmul
keeps a compute-dtype cast of it, each expert's gate and up matmuls cast their routed copies separately (two
casts instead of the fp32 copy) and the shared experts' gate and up one cast each; the router's softmax and
logsumexp run in fp32 (CUDA's autocast rules), the routing weights stay fp32.
Measured on CPU against the bytes autograd saves, in fp32 and under CPU autocast (tests/unit/test_plan.py,
tests/unit/test_plan_cuda.py); not measured on a GPU.
"""

from __future__ import annotations

from llmtrain.model.family import BlockShape

FP32 = 4
INT64 = 8


def router_bytes(shape: BlockShape, tokens: int, aux_loss: bool, renormalized: bool) -> float:
    """The router's fp32 tensors and the routing's indices, whatever the compute dtype."""
    routed = tokens * shape.top_k
    scores = (2 if aux_loss else 1) * FP32 * tokens * shape.experts
    weights = (2 if renormalized else 1) * FP32 * routed
    return scores + weights + 3 * INT64 * routed


def expert_bytes(shape: BlockShape, tokens: int, size: int, autocast: bool) -> float:
    """The routed copies (and under autocast the casts of the input), their SwiGLU hidden tensors, the outputs the
    combine weighs, and the shared experts'."""
    routed = tokens * shape.top_k
    d = shape.d_model
    if autocast:  # the router's cast, each expert's two casts of its routed copies, the shared experts' two casts
        inputs = tokens * d + 2 * routed * d + (2 * tokens * d if shape.shared_ffn else 0)
    else:
        inputs = routed * d
    hidden = 4 * routed * shape.expert_ffn + 4 * tokens * shape.shared_ffn
    return (inputs + routed * d + hidden) * size


def moe_saved_bytes(model_cfg, shape: BlockShape, tokens: int, size: int, autocast: bool = False) -> float:
    """All of the above for one sparse block; `size`: bytes per element of the compute dtype."""
    moe = model_cfg.moe
    aux_loss = bool(moe.router_aux_loss_coef or moe.router_z_loss_coef)
    return (router_bytes(shape, tokens, aux_loss, moe.norm_topk_prob)
            + expert_bytes(shape, tokens, size, autocast))
