"""Parameter counts and training FLOPs per token of the configured model, from the config alone (no torch).

Every family is counted from the shapes of its blocks, as its spec gives them (llmtrain/model/<arch>/, a
BlockShape per layer: a mixture-of-experts model's dense first layers differ from its sparse ones): q, k and v
(k and v n_kv_heads x head_dim wide), the attention projection, the MLP (one fc matrix with GELU, or SwiGLU's gate,
up (fc) and down (proj)), two norms (a bias each too where the family has biases), and where the family has them
the biases of the linear layers, q/k norms (per head: two head_dim weights; whole width: q's and k's widths) and a
learned position table. A sparse block's MLP is the MoE: the router (d_model x n_experts), every expert's gate, up
and down matrices, and the shared experts' SwiGLU; tensor parallel computes it whole on every rank (replicated).
Expert parallel (`parallel.ep`) leaves a rank 1/ep of each sparse block's routed experts.
The head is tied to the token embedding unless model.tie_embeddings=false (families that may untie it), when it is
one more vocabulary x d_model matrix on the last stage. The tests compare every count with the real model, per
pipeline stage.

Active parameters are what one token runs through: everything but the routed experts' matrices, plus top_k of
them in each sparse block. FLOPs per token follow the active parameters (the router's d_model x n_experts
included), so MFU counts the FLOPs a token really costs.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from types import SimpleNamespace

from omegaconf import DictConfig, OmegaConf

from llmtrain.config.derived import padded_vocab_size
from llmtrain.model.family import BlockShape
from llmtrain.model.registry import family_of
from llmtrain.parallel import layout as pp_lib
from llmtrain.plan.plain import Plain, thawed_dict

__all__ = ["BlockShape", "StagePlan", "block_shape", "block_shapes", "block_params", "stage_params",
           "active_params", "flops_per_token", "routed_expert_params"]


def block_shape(model_cfg, layer: int = 0) -> BlockShape:
    """Block `layer`'s widths and traits, from the model family's spec."""
    return family_of(model_cfg).block_shape(model_cfg, layer)


def block_shapes(model_cfg) -> list[BlockShape]:
    """Every block's shape, by layer index. Worked out once per model section's values: a plan asks for them
    several times, and `--suggest` plans hundreds of layouts of one model."""
    if isinstance(model_cfg, DictConfig):
        return list(_shapes_of(_frozen(OmegaConf.to_container(model_cfg, resolve=True))))
    if isinstance(model_cfg, Plain):
        return list(_shapes_of(_frozen(thawed_dict(model_cfg))))
    spec = family_of(model_cfg)
    return [spec.block_shape(model_cfg, i) for i in range(model_cfg.n_layers)]


def _frozen(value):
    """A hashable copy of a config section's plain values."""
    if isinstance(value, dict):
        return tuple(sorted((k, _frozen(v)) for k, v in value.items()))
    if isinstance(value, list):
        return ("<list>", tuple(_frozen(v) for v in value))
    return value


def _thawed(value):
    """_frozen's values as attribute namespaces (what a spec reads of a model section)."""
    if isinstance(value, tuple) and value and value[0] == "<list>":
        return [_thawed(v) for v in value[1]]
    if isinstance(value, tuple):
        return SimpleNamespace(**{k: _thawed(v) for k, v in value})
    return value


@functools.lru_cache(maxsize=32)
def _shapes_of(frozen_model) -> tuple[BlockShape, ...]:
    m = _thawed(frozen_model)
    spec = family_of(m)
    return tuple(spec.block_shape(m, i) for i in range(m.n_layers))


def head_dim_of(shape: BlockShape, model_cfg) -> int:
    return shape.attention // model_cfg.n_heads


def attention_matrix_params(shape: BlockShape) -> int:
    """q, k, v and the attention projection."""
    d = shape.d_model
    return d * shape.attention + 2 * d * shape.kv + shape.attention * d


def expert_params(shape: BlockShape) -> int:
    """One routed expert's SwiGLU matrices (gate, up, down)."""
    return 3 * shape.d_model * shape.expert_ffn


def moe_params(shape: BlockShape) -> int:
    """A sparse block's MoE: router, every routed expert, the shared experts' SwiGLU (all replicated under TP)."""
    d = shape.d_model
    return d * shape.experts + shape.experts * expert_params(shape) + 3 * d * shape.shared_ffn


def block_matrix_params(shape: BlockShape) -> int:
    """Weights of one dense block's matrices: q, k, v, the attention projection and the MLP's (all split by tensor
    parallel; the layers fp8 runs in float8). A sparse block's: the attention's (its MoE is counted apart)."""
    mlp = 0 if shape.sparse else (shape.mlp_in_matrices + 1) * shape.d_model * shape.ffn
    return attention_matrix_params(shape) + mlp


def qk_norm_params(shape: BlockShape, model_cfg) -> int:
    """Weights of q's and k's RMSNorms: per head (one head_dim weight each) or over their whole widths."""
    if shape.qk_norm == "head":
        return 2 * head_dim_of(shape, model_cfg)
    if shape.qk_norm == "full":
        return shape.attention + shape.kv
    return 0


def block_params(shape: BlockShape, model_cfg) -> tuple[int, int]:
    """(parameters of one block, of them split by tensor parallel). Replicated: the norms, the projections'
    biases, q/k norms and a sparse block's MoE."""
    d = shape.d_model
    split = block_matrix_params(shape)
    replicated = 2 * d + qk_norm_params(shape, model_cfg)  # the two norms' weights
    if shape.biases:  # column-parallel q/k/v and fc biases split with their weights; the rest replicated
        split += shape.attention + 2 * shape.kv + (0 if shape.sparse else shape.ffn)
        replicated += 2 * d + d + (0 if shape.sparse else d)  # norm biases, projection biases
    if shape.sparse:
        replicated += moe_params(shape)
    return split + replicated, split


def routed_expert_params(shape: BlockShape) -> int:
    """A sparse block's routed experts (the three stacked tensors): what expert parallel splits over ep ranks."""
    return shape.experts * expert_params(shape) if shape.sparse else 0


def block_params_per_rank(shape: BlockShape, model_cfg, tp: int, ep: int = 1) -> int:
    """One block's parameters on a rank: its tensor-parallel share, and 1/ep of its routed experts."""
    total, split = block_params(shape, model_cfg)
    routed = routed_expert_params(shape)
    return total - split + split // tp - routed + routed // ep


def idle_expert_params(shape: BlockShape) -> int:
    """Routed expert parameters a token does not run through: all but top_k experts."""
    return (shape.experts - shape.top_k) * expert_params(shape) if shape.sparse else 0


def embedding_params(model_cfg) -> tuple[int, int, int]:
    """(token embedding, position table, untied head) parameters; 0 for what the model does not have."""
    m = model_cfg
    spec = family_of(m)
    tok = padded_vocab_size(m) * m.d_model
    pos = m.seq_len * m.d_model if spec.learned_positions else 0
    head = 0 if spec.always_tied or m.tie_embeddings else tok
    return tok, pos, head


def final_norm_params(model_cfg) -> int:
    return model_cfg.d_model * (2 if block_shape(model_cfg, model_cfg.n_layers - 1).biases else 1)


@dataclass
class StagePlan:
    stage: int
    layers: list[int]
    params: int          # this stage's parameters (whole, before TP)
    params_per_rank: int  # after tensor and expert parallel (before ZeRO sharding)
    expert_params_per_rank: int = 0  # of them, routed experts (this rank's 1/ep of them): ZeRO-sharded apart
    in_flight: float = 0.0     # micro-batches whose activations are alive at the peak
    activation_bytes: float = 0.0
    state_bytes: dict = field(default_factory=dict)
    peak_bytes: float = 0.0


def stage_params(cfg) -> tuple[list[StagePlan], int, int]:
    """Per-stage parameter counts (exact; the tests check against the real model) and the model's total and
    non-embedding counts (without the token embedding, the position table and an untied head)."""
    m, p = cfg.model, cfg.parallel
    shapes = block_shapes(m)
    blocks = [block_params(s, m)[0] for s in shapes]
    ep = p.get("ep", 1)
    blocks_per_rank = [block_params_per_rank(s, m, p.tp, ep) for s in shapes]
    tok, pos, head = embedding_params(m)
    norm = final_norm_params(m)
    total = tok + pos + head + norm + sum(blocks)
    stages_n = p.pp * p.virtual_stages
    counts = pp_lib.layers_per_stage(m.n_layers, stages_n, p.pp_layers)
    plans = []
    for s in range(stages_n):
        start = sum(counts[:s])
        layers = list(range(start, start + counts[s]))
        n = sum(blocks[i] for i in layers)
        per_rank = sum(blocks_per_rank[i] for i in layers)
        if s == 0:  # token embedding (vocab-parallel) and positions (replicated)
            n, per_rank = n + tok + pos, per_rank + tok // p.tp + pos
        if s == stages_n - 1:  # final norm and the head: its own, or the tied one (on another stage: a copy)
            n, per_rank = n + norm, per_rank + norm
            own_head = head or (tok if s != 0 else 0)
            n, per_rank = n + own_head, per_rank + own_head // p.tp
        plans.append(StagePlan(s, layers, n, per_rank, sum(routed_expert_params(shapes[i]) // ep for i in layers)))
    return plans, total, total - tok - pos - head


def active_params(cfg, total: int | None = None) -> int:
    """Parameters one token runs through: the total less, in each sparse block, the routed experts it skips."""
    if total is None:
        total = stage_params(cfg)[1]
    return total - sum(idle_expert_params(s) for s in block_shapes(cfg.model))


def moe_flops_per_token(model_cfg) -> float:
    """Training FLOPs per token of the sparse blocks' MoE (router, top_k experts, shared experts): the part that
    tensor parallel computes whole on every rank."""
    total = 0
    for s in block_shapes(model_cfg):
        if s.sparse:
            total += moe_params(s) - idle_expert_params(s)
    return 6.0 * total


def flops_per_token(cfg, n_params_non_embedding: int | None = None) -> float:
    """Training FLOPs per token: 6 x (active non-embedding parameters + the output head's d x V, counted once, tied
    or not) + 6 x L x s x (n_heads x head_dim) for causal attention scores and values (Kaplan et al. 2020: 2 matmuls
    of 2 x s x width per token forward, halved by the causal mask, x 3 for backward; recompute is not model FLOPs).
    Grouped-query attention's narrower k and v show in the parameters; its scores are as wide as without. Active:
    a sparse block counts its router and top_k of its routed experts (`n_params_non_embedding` is the total
    non-embedding count, as stage_params gives it)."""
    m = cfg.model
    if n_params_non_embedding is None:
        n_params_non_embedding = stage_params(cfg)[2]
    shapes = block_shapes(m)
    active = n_params_non_embedding - sum(idle_expert_params(s) for s in shapes)
    head = m.d_model * padded_vocab_size(m)
    return 6.0 * (active + head) + 6.0 * m.seq_len * sum(s.attention for s in shapes)
