"""What a model family tells the rest of llmtrain, without torch: its config keys and their checks, the shapes of
its blocks (parameter and FLOP counts, the planner's activation terms), its tensor-parallel plan, its Hugging Face
names and config.json, and how to build its torch module.

Each family is one folder under llmtrain/model/ whose __init__.py defines SPEC, a FamilySpec; registry.py finds it
by model.arch. Config, plan, parallel and checkpoint code ask the spec instead of testing the family's name.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, replace
from typing import Callable

Require = Callable[[bool, str, str], None]  # require(condition, "model.key", "one-line message")


def positive(cfg, require: Require, *keys: str) -> None:
    """Each dotted key ("model.rope_theta") of `cfg` holds a number > 0."""
    for key in keys:
        value = cfg
        for part in key.split("."):
            value = value[part]
        require(value is not None and value > 0, key, f"must be > 0 (got {value})")


def head_width(m) -> int:
    """Width of one attention head: model.head_dim, else d_model / n_heads."""
    return m.head_dim or m.d_model // m.n_heads


def moe_args(m):
    """model.moe as MoEArgs (model/moe/args.py), or None for a dense model."""
    if getattr(m, "moe", None) is None:
        return None
    from llmtrain.model.moe.args import MoEArgs

    return MoEArgs.from_config(m)


# Tensor-parallel styles of a block's submodules (parallel/tensor_parallel.py applies them):
#   "gather"     the residual stream enters whole (replicated), shared by the module's column-parallel children
#   "colwise"    output features split over tp ranks; "rowwise" input features split, output back to the residual
#   "replicated" computed whole on every tp rank (a mixture of experts: its input gathered, its output handed back)
#   "sequence"   a norm on the residual stream: sequence-sharded under sequence parallel, else left alone
#   "head_norm"  a per-head norm on a column-parallel output viewed (b, t, heads, head_dim): local heads, its
#                weight replicated so its gradient is summed over the ranks' heads
_ATTENTION_PLAN = {"ln_1": "sequence", "ln_2": "sequence", "attn": "gather", "attn.q": "colwise",
                   "attn.k": "colwise", "attn.v": "colwise", "attn.proj": "rowwise"}
_MLP_PLAN = {"mlp": "gather", "mlp.gate": "colwise", "mlp.fc": "colwise", "mlp.proj": "rowwise"}


@dataclass(frozen=True)
class BlockShape:
    """The widths of one transformer block's matrices, and the traits the planner's memory terms follow."""

    d_model: int
    attention: int  # n_heads x head_dim: q's and the projection's width
    kv: int  # n_kv_heads x head_dim: k's and v's width (= attention without grouped-query attention)
    ffn: int  # the dense MLP's hidden width (a sparse block's experts: see `experts`)
    gated: bool  # SwiGLU: gate and up matrices; else one fc matrix with GELU
    biases: bool  # linear layers and norms carry biases (GPT-2)
    rotary: bool = False  # positions rotate q and k (cos and sin kept for backward)
    rms_norm: bool = False  # RMSNorm (torch's composite rms_norm keeps the normalized tensor too on CPU)
    qk_norm: str | None = None  # RMSNorm on q and k: "head" (per head, Qwen3) or "full" (whole width, OLMoE)
    experts: int = 0  # routed experts of a sparse block; 0 = dense
    top_k: int = 0  # experts each token is routed to
    expert_ffn: int = 0  # hidden width of one expert
    shared_ffn: int = 0  # hidden width of the shared experts together (0 = none)

    @property
    def mlp_in_matrices(self) -> int:
        return 2 if self.gated else 1

    @property
    def sparse(self) -> bool:
        return self.experts > 0


class FamilySpec:
    """One model family. Subclasses set the class attributes and override what differs; the defaults describe a
    Llama-like decoder (rotary, RMSNorm, SwiGLU, no biases)."""

    name: str = ""  # model.arch
    title: str = ""  # how messages name it: "GPT-2", "Llama"
    summary: str = ""  # one line for docs and --help
    # model.* keys this family reads besides the ones every family reads; any other family's key left at its
    # schema default (validation refuses it otherwise).
    keys: tuple[str, ...] = ()
    learned_positions: bool = False  # a position table: model.seq_len is fixed by the weights
    always_tied: bool = False  # the head is always the token embedding (model.tie_embeddings not read)
    supports_moe: bool = False  # model.moe may be set
    module: str = ""  # "package.module:factory" of factory(model_cfg) -> nn.Module (imported only when building)
    hf: str = ""  # "package.module" of its Hugging Face adapter (see below); "" = no Hugging Face interop
    hf_architecture: str = ""  # config.json "architectures" entry it writes and reads
    hf_model_types: tuple[str, ...] = ()  # config.json "model_type" values it reads
    calibration: str = ""  # which of `llmtrain tune`'s fitted families its timings join (default: name)
    qk_norm: str | None = None  # BlockShape.qk_norm: "head", "full" or None

    @property
    def setting(self) -> str:
        """How messages name the choice of this family: model.arch=NAME."""
        return f"model.arch={self.name}"

    # --- config -----------------------------------------------------------------------------------------------
    def validate(self, cfg, require: Require) -> None:
        """The family's own checks, each one line naming its key."""

    def kv_heads(self, m) -> int:
        return m.n_kv_heads if m.n_kv_heads is not None else m.n_heads

    def ffn_dim(self, m) -> int:
        """The dense MLP's hidden width when model.ffn_dim is null."""
        return 4 * m.d_model

    def mlp_width_key(self, m) -> str:
        """What to call the MLP width in a message."""
        return "the MLP width (model.ffn_dim)"

    # --- shapes -----------------------------------------------------------------------------------------------
    def block_shape(self, m, layer: int = 0) -> BlockShape:
        """Block `layer`'s widths (a MoE model's dense and sparse blocks differ)."""
        width = head_width(m)
        dense = BlockShape(d_model=m.d_model, attention=m.n_heads * width, kv=self.kv_heads(m) * width,
                           ffn=m.ffn_dim or self.ffn_dim(m), gated=True, biases=False, rotary=True, rms_norm=True,
                           qk_norm=self.qk_norm)
        return with_experts(dense, m, layer)

    def shape_key(self, leaf: str, dim: int) -> str:
        """The config key that sets dimension `dim` of a block parameter `leaf` ("attn.k.weight"), for a
        shape-mismatch message; embeddings and the head are handled by the caller."""
        module, _, kind = leaf.rpartition(".")
        if leaf.startswith("mlp.experts."):  # [experts, out, in]
            if dim == 0:
                return "model.moe.n_experts"
            return "model.moe.expert_ffn_dim" if dim == (2 if kind == "proj" else 1) else "model.d_model"
        if module == "mlp.router":
            return "model.moe.n_experts" if dim == 0 else "model.d_model"
        if module.startswith("mlp.shared."):
            return "model.moe.n_shared_experts" if dim == (1 if module.endswith("proj") else 0) else "model.d_model"
        if module in ("attn.q_norm", "attn.k_norm"):
            return "model.head_dim"
        if module in ("attn.k", "attn.v") and dim == 0:
            return "model.n_kv_heads"
        if (module == "attn.q" and dim == 0) or (module == "attn.proj" and dim == 1):
            return "model.n_heads"
        if (module in ("mlp.fc", "mlp.gate") and dim == 0) or (module == "mlp.proj" and dim == 1):
            return "model.ffn_dim"
        return "model.d_model"

    # --- parallel ---------------------------------------------------------------------------------------------
    def tensor_parallel_plan(self, block_names: set[str]) -> dict[str, str]:
        """{submodule path inside a block: style}; styles: "colwise", "rowwise", "replicated" (a module computed
        whole on every tensor-parallel rank). `block_names` are the block's submodule paths, so a plan can depend
        on what the block holds (a sparse block's experts)."""
        plan = {name: style for name, style in _ATTENTION_PLAN.items() if name in block_names}
        if "mlp.router" in block_names:  # a mixture of experts: whole on every rank
            plan["mlp"] = "replicated"
        else:
            plan.update({name: style for name, style in _MLP_PLAN.items() if name in block_names})
        if self.qk_norm == "head":
            plan.update({name: "head_norm" for name in ("attn.q_norm", "attn.k_norm") if name in block_names})
        return plan

    # --- building ---------------------------------------------------------------------------------------------
    def build(self, model_cfg):
        """The torch module for `model_cfg` on the current default device (meta for shapes only)."""
        path, _, factory = self.module.partition(":")
        return getattr(importlib.import_module(path), factory)(model_cfg)

    def hf_adapter(self):
        """The Hugging Face adapter module (model/<family>/hf.py), None without interop. It defines:

        - to_hf_state(tensors, m) -> {HF name: tensor}: llmtrain's full tensors under Hugging Face names, the
          embedding (and an untied head) cut to m.vocab_size; a stacked parameter may become several tensors
          (weight_pieces.unstack: one per expert).
        - pieces(key) -> list[Piece] | None: where stored tensor `key` goes (weight_pieces.Piece: whole, transposed,
          a block of a fused tensor, or row `slot` of a stacked parameter); [] for a tensor without weights, None
          for a name the family does not have.
        - is_state(keys) -> bool: a weights file without config.json has this family's names.
        - hf_config(m) -> dict: config.json of the transformers model equal to llmtrain's for `m`.
        - check_hf_config(conf, path, m): ConfigError (key model.init_from) for what config.json says and the
          shapes cannot tell (head split, epsilon, rotary settings, ...).
        - check_exportable(m): ConfigError (key --format) when the Hugging Face class cannot hold the model."""
        return importlib.import_module(self.hf) if self.hf else None


def with_experts(dense: BlockShape, m, layer: int) -> BlockShape:
    """`dense` with a sparse layer's experts filled in (model.moe: n_experts, top_k, the expert and shared widths)."""
    args = moe_args(m)
    if args is None or not args.is_sparse(layer):
        return dense
    return replace(dense, experts=args.n_experts, top_k=args.top_k, expert_ffn=args.ffn,
                   shared_ffn=args.n_shared_experts * args.ffn)
