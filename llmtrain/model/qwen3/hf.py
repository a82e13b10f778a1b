"""llmtrain's Qwen3 <-> Hugging Face Qwen3ForCausalLM (dense) and Qwen3MoeForCausalLM (model.moe set): names and
config.json.

Llama's names (model/llama/hf.py) plus the per-head q/k norms; on a sparse layer the router is `mlp.gate` and each
expert's matrices are stored apart (`mlp.experts.{j}.gate_proj.weight` [f, d], `up_proj`, `down_proj` [d, f]),
each row j of llmtrain's stacked [experts, out, in] parameters, with no transpose.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from llmtrain.config import ConfigError
from llmtrain.model.family import moe_args
from llmtrain.model.llama import hf as llama_hf
from llmtrain.model.weight_pieces import Piece, unstack

ARCHITECTURE, MOE_ARCHITECTURE = "Qwen3ForCausalLM", "Qwen3MoeForCausalLM"
# Inside model.layers.{i}. (HF) and layers.{i}. (llmtrain), besides Llama's.
_LAYER = {"self_attn.q_norm.weight": "attn.q_norm.weight",
          "self_attn.k_norm.weight": "attn.k_norm.weight",
          "mlp.gate.weight": "mlp.router.weight"}
_LAYER_BACK = {ours: hf for hf, ours in _LAYER.items()}
# One expert's matrix (HF) -> llmtrain's stacked parameter of every expert.
_EXPERT = {"gate_proj": "gate", "up_proj": "fc", "down_proj": "proj"}
_EXPERT_BACK = {ours: hf for hf, ours in _EXPERT.items()}
_LAYER_NAME = re.compile(r"^layers\.(\d+)\.(.+)$")
_HF_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
_HF_EXPERT = re.compile(r"^mlp\.experts\.(\d+)\.(\w+)\.weight$")
_STACKED = re.compile(r"^mlp\.experts\.(gate|fc|proj)$")


def hf_name(name: str) -> str:
    """The Hugging Face name of llmtrain parameter `name` (not a stacked expert parameter: see to_hf_state)."""
    m = _LAYER_NAME.match(name)
    if m is not None and m.group(2) in _LAYER_BACK:
        return f"model.layers.{m.group(1)}.{_LAYER_BACK[m.group(2)]}"
    return llama_hf.hf_name(name)


def to_hf_state(tensors: dict[str, torch.Tensor], model_cfg) -> dict[str, torch.Tensor]:
    """llmtrain names -> Hugging Face names; each stacked expert parameter becomes one tensor per expert, the
    embedding (and an untied head) is cut to vocab_size as Llama's are."""
    llama_names, out = {}, {}
    for name, t in tensors.items():
        m = _LAYER_NAME.match(name)
        stacked = _STACKED.match(m.group(2)) if m else None
        if stacked is not None:
            prefix, hf = f"model.layers.{m.group(1)}.mlp.experts", _EXPERT_BACK[stacked.group(1)]
            out.update(unstack(t, lambda j: f"{prefix}.{j}.{hf}.weight"))
        elif m is not None and m.group(2) in _LAYER_BACK:
            out[hf_name(name)] = t
        else:
            llama_names[name] = t
    return {**llama_hf.to_hf_state(llama_names, model_cfg), **out}


def pieces(key: str) -> list[Piece] | None:
    """Where the stored tensor `key` goes: Llama's names, the q/k norms, the router, or row j of a stacked expert
    parameter; None for a name Qwen3 does not have."""
    m = _HF_LAYER.match(key)
    if m is None:
        return llama_hf.pieces(key)
    layer, leaf = m.groups()
    if leaf in _LAYER:
        return [Piece(f"layers.{layer}.{_LAYER[leaf]}", key)]
    expert = _HF_EXPERT.match(leaf)
    if expert is not None:
        ours = _EXPERT.get(expert.group(2))
        return None if ours is None else [Piece(f"layers.{layer}.mlp.experts.{ours}", key, slot=int(expert.group(1)))]
    return llama_hf.pieces(key)


def is_state(keys) -> bool:
    """Llama's names with per-head q/k norms (OLMoE's are named alike: the caller prefers the configured family)."""
    return llama_hf.is_state(keys) and any(k.endswith("self_attn.q_norm.weight") for k in keys)


def check_exportable(model_cfg, architecture: str = MOE_ARCHITECTURE) -> None:
    """Qwen3-MoE (and OLMoE) have no shared experts, no sigmoid scores and no balancing bias: such a model stays
    llmtrain's."""
    args = moe_args(model_cfg)
    if args is None:
        return
    for ok, what in ((args.n_shared_experts == 0, f"model.moe.n_shared_experts={args.n_shared_experts}"),
                     (args.score_func == "softmax", f"model.moe.score_func={args.score_func}"),
                     (args.bias_update_rate == 0, f"model.moe.bias_update_rate={args.bias_update_rate}")):
        if not ok:
            raise ConfigError("--format", f"Hugging Face {architecture} has no equivalent of {what}; use "
                                          f"--format safetensors")


def moe_config(model_cfg) -> dict:
    """The config.json keys of a mixture of experts shared by Qwen3-MoE and OLMoE."""
    args = moe_args(model_cfg)
    return {"num_experts": args.n_experts, "num_experts_per_tok": args.top_k, "norm_topk_prob": args.norm_topk_prob,
            "router_aux_loss_coef": args.router_aux_loss_coef, "output_router_logits": False}


def hf_config(model_cfg) -> dict:
    """config.json of the transformers model equal to llmtrain's Qwen3 for `model_cfg`: Qwen3ForCausalLM, or
    Qwen3MoeForCausalLM with model.moe (its dense layers are mlp_only_layers, model.moe.n_dense_layers of them)."""
    conf = llama_hf.hf_config(model_cfg)
    del conf["mlp_bias"]
    conf.update(model_type="qwen3", architectures=[ARCHITECTURE], use_sliding_window=False, sliding_window=None,
                max_window_layers=model_cfg.n_layers)
    args = moe_args(model_cfg)
    if args is not None:
        conf.update(model_type="qwen3_moe", architectures=[MOE_ARCHITECTURE], moe_intermediate_size=args.ffn,
                    decoder_sparse_step=args.sparse_every, mlp_only_layers=list(range(args.n_dense_layers)),
                    **moe_config(model_cfg))
    return conf


def refuser(path: Path):
    def refuse(what: str, fix: str) -> None:
        raise ConfigError("model.init_from", f"{path} has {what} but {fix}")
    return refuse


def check_moe_config(conf: dict, path: Path, model_cfg, experts_key: str) -> None:
    """The routing config.json sets and the shapes cannot tell: experts per token, their weights' renormalization."""
    refuse, args = refuser(path), moe_args(model_cfg)
    top_k = conf.get("num_experts_per_tok")
    if top_k is not None and top_k != args.top_k:
        refuse(f"num_experts_per_tok={top_k}", f"model.moe.top_k={args.top_k}; set model.moe.top_k={top_k}")
    experts = conf.get(experts_key, conf.get("num_local_experts"))
    if experts is not None and experts != args.n_experts:
        refuse(f"{experts_key}={experts}", f"model.moe.n_experts={args.n_experts}; set model.moe.n_experts={experts}")
    norm = conf.get("norm_topk_prob")
    if norm is not None and bool(norm) != args.norm_topk_prob:
        refuse(f"norm_topk_prob={str(bool(norm)).lower()}", f"model.moe.norm_topk_prob={args.norm_topk_prob}; set "
                                                            f"model.moe.norm_topk_prob={str(bool(norm)).lower()}")


def check_hf_config(conf: dict, path: Path, model_cfg) -> None:
    """Llama's checks (head split, epsilon, rotary settings, tied head, activation), then whether the folder is
    dense or a mixture of experts as the config is, and for one its routing and which layers are sparse."""
    llama_hf.check_hf_config(conf, path, model_cfg)
    refuse, args = refuser(path), moe_args(model_cfg)
    if conf.get("use_sliding_window"):
        refuse("use_sliding_window=true", "llmtrain's Qwen3 attends to the whole context")
    sparse = conf.get("model_type") == "qwen3_moe"
    if sparse != (args is not None):
        what = "model_type qwen3_moe (a mixture of experts)" if sparse else "model_type qwen3 (dense)"
        refuse(what, "model.moe is set; set model.moe=null" if args else "model.moe is null; set model.moe "
                                                                         "(n_experts, top_k, expert_ffn_dim)")
    if not sparse:
        return
    check_moe_config(conf, path, model_cfg, "num_experts")
    step = conf.get("decoder_sparse_step", 1)
    if step != args.sparse_every:
        refuse(f"decoder_sparse_step={step}", f"model.moe.sparse_every={args.sparse_every}; set "
                                              f"model.moe.sparse_every={step}")
    dense = list(conf.get("mlp_only_layers") or [])
    if dense != list(range(len(dense))):
        refuse(f"mlp_only_layers={dense}", "llmtrain keeps only the first layers dense (model.moe.n_dense_layers)")
    if len(dense) != args.n_dense_layers:
        refuse(f"mlp_only_layers={dense}", f"model.moe.n_dense_layers={args.n_dense_layers}; set "
                                           f"model.moe.n_dense_layers={len(dense)}")
