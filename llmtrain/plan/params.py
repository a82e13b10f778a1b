"""Parameter counts and training FLOPs per token of the configured model, from the config alone (no torch).

Both architectures (model.arch) are counted from the shapes of one block (llmtrain/model/): GPT-2's biased q/k/v,
projection and 4 x d_model GELU MLP with two LayerNorms, plus a learned position table; Llama's bias-free q, k and v
(k and v n_kv_heads x head_dim wide), projection, SwiGLU's gate, up (fc) and down (proj) matrices and two RMSNorms
(a weight each), no position table. The head is tied to the token embedding unless model.tie_embeddings=false (Llama
only), when it is one more vocabulary x d_model matrix on the last stage. The tests compare every count with the
real model, per pipeline stage.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from llmtrain.config.derived import ffn_dim, head_dim, kv_heads, padded_vocab_size
from llmtrain.parallel import layout as pp_lib


@dataclass(frozen=True)
class BlockShape:
    """The widths of one transformer block's matrices."""

    d_model: int
    attention: int  # n_heads x head_dim: q's and the projection's width
    kv: int  # n_kv_heads x head_dim: k's and v's width (= attention for GPT-2 and without GQA)
    ffn: int  # the MLP's hidden width
    gated: bool  # SwiGLU: gate and up matrices (Llama); else one fc matrix (GPT-2)
    biases: bool  # GPT-2's linear layers and LayerNorms have biases; Llama has none

    @property
    def mlp_in_matrices(self) -> int:
        return 2 if self.gated else 1


def is_llama(model_cfg) -> bool:
    return model_cfg.arch == "llama"


def block_shape(model_cfg) -> BlockShape:
    m = model_cfg
    width = head_dim(m)
    return BlockShape(d_model=m.d_model, attention=m.n_heads * width, kv=kv_heads(m) * width, ffn=ffn_dim(m),
                      gated=is_llama(m), biases=not is_llama(m))


def block_matrix_params(shape: BlockShape) -> int:
    """Weights of one block's matrices: q, k, v, the attention projection and the MLP's (all split by tensor
    parallel; the matmuls whose FLOPs 6 x parameters counts, and the layers fp8 runs in float8)."""
    d = shape.d_model
    attention = d * shape.attention + 2 * d * shape.kv + shape.attention * d
    return attention + (shape.mlp_in_matrices + 1) * d * shape.ffn


def block_params(model_cfg) -> tuple[int, int]:
    """(parameters of one transformer block, of them split by tensor parallel)."""
    s = block_shape(model_cfg)
    matrices = block_matrix_params(s)
    if not s.biases:  # two RMSNorm weights, replicated
        return matrices + 2 * s.d_model, matrices
    # column-parallel q/k/v and fc biases are split with their weights; the projections' biases and the
    # LayerNorms' weights and biases are replicated
    split_biases = s.attention + 2 * s.kv + s.ffn
    replicated = 2 * s.d_model + 2 * 2 * s.d_model
    return matrices + split_biases + replicated, matrices + split_biases


def embedding_params(model_cfg) -> tuple[int, int, int]:
    """(token embedding, position table, untied head) parameters; 0 for what the model does not have."""
    m = model_cfg
    tok = padded_vocab_size(m) * m.d_model
    if is_llama(m):
        return tok, 0, 0 if m.tie_embeddings else tok
    return tok, m.seq_len * m.d_model, 0


def final_norm_params(model_cfg) -> int:
    return model_cfg.d_model if is_llama(model_cfg) else 2 * model_cfg.d_model


@dataclass
class StagePlan:
    stage: int
    layers: list[int]
    params: int          # this stage's parameters (whole, before TP)
    params_per_rank: int  # after tensor parallel (before ZeRO sharding)
    in_flight: float = 0.0     # micro-batches whose activations are alive at the peak
    activation_bytes: float = 0.0
    state_bytes: dict = field(default_factory=dict)
    peak_bytes: float = 0.0


def stage_params(cfg) -> tuple[list[StagePlan], int, int]:
    """Per-stage parameter counts (exact; the tests check against the real model) and the model's total and
    non-embedding counts (without the token embedding, the position table and an untied head)."""
    m, p = cfg.model, cfg.parallel
    block, block_split = block_params(m)
    tok, pos, head = embedding_params(m)
    norm = final_norm_params(m)
    total = tok + pos + head + norm + block * m.n_layers
    stages_n = p.pp * p.virtual_stages
    counts = pp_lib.layers_per_stage(m.n_layers, stages_n, p.pp_layers)
    plans = []
    for s in range(stages_n):
        n = block * counts[s]
        per_rank = (block - block_split + block_split // p.tp) * counts[s]
        if s == 0:  # token embedding (vocab-parallel) and positions (replicated)
            n, per_rank = n + tok + pos, per_rank + tok // p.tp + pos
        if s == stages_n - 1:  # final norm and the head: its own, or the tied one (on another stage: a copy)
            n, per_rank = n + norm, per_rank + norm
            own_head = head or (tok if s != 0 else 0)
            n, per_rank = n + own_head, per_rank + own_head // p.tp
        start = sum(counts[:s])
        plans.append(StagePlan(s, list(range(start, start + counts[s])), n, per_rank))
    return plans, total, total - tok - pos - head


def flops_per_token(cfg, n_params_non_embedding: int | None = None) -> float:
    """Training FLOPs per token: 6 x (non-embedding parameters + the output head's d x V, counted once, tied or not)
    + 6 x L x s x (n_heads x head_dim) for causal attention scores and values (Kaplan et al. 2020: 2 matmuls of
    2 x s x width per token forward, halved by the causal mask, x 3 for backward; recompute is not model FLOPs).
    Grouped-query attention's narrower k and v show in the parameters; its scores are as wide as without."""
    m = cfg.model
    if n_params_non_embedding is None:
        n_params_non_embedding = stage_params(cfg)[2]
    head = m.d_model * padded_vocab_size(m)
    return 6.0 * (n_params_non_embedding + head) + 6.0 * m.n_layers * m.seq_len * block_shape(m).attention
