"""What the Qwen3 and OLMoE families refuse, each in one line naming the key: configs OLMoE cannot be, models
their Hugging Face classes cannot hold (export), and config.json settings the shapes cannot tell (model.init_from).
The adapters read configs only: no transformers, no tensors."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmtrain.checkpoint.export import check_hf_exportable
from llmtrain.config import ConfigError, compose_config
from llmtrain.config.validate import validate
from llmtrain.model.registry import family, family_for_hf_type

CONF = Path("Qwen3-30B-A3B/config.json")


def refusal(fn, *args) -> tuple[str, str]:
    with pytest.raises(ConfigError) as e:
        fn(*args)
    assert "\n" not in str(e.value)
    return e.value.key, e.value.message


@pytest.mark.parametrize("overrides, key, message", [
    (["model.moe=null"], "model.moe",
     "model.arch=olmoe is always a mixture of experts; set model.moe (model=olmoe-1b-7b sets OLMoE's)"),
    (["parallel.tp=2", "cluster.nproc_per_node=2"], "parallel.tp",
     "model.arch=olmoe normalizes q and k over all heads at once, which tensor parallel splits over ranks; use "
     "parallel.tp=1 (got 2)"),
])
def test_olmoe_configs_it_cannot_be_are_refused(overrides, key, message):
    assert refusal(validate, compose_config(["model=olmoe-1b-7b", *overrides])) == (key, message)


def test_qwen3_trains_under_tensor_parallel_and_dense():
    validate(compose_config(["model=moe-tiny", "parallel.tp=2", "cluster.nproc_per_node=2"]))
    validate(compose_config(["model=qwen3-0.6b", "model.moe=null"]))


@pytest.mark.parametrize("overrides, message", [
    (["model=moe-tiny"], "Hugging Face Qwen3MoeForCausalLM has no equivalent of model.moe.n_shared_experts=1; use "
                         "--format safetensors"),
    (["model=qwen3-moe-30b-a3b", "model.moe.score_func=sigmoid"],
     "Hugging Face Qwen3MoeForCausalLM has no equivalent of model.moe.score_func=sigmoid; use --format safetensors"),
    (["model=olmoe-1b-7b", "model.moe.bias_update_rate=0.001"],
     "Hugging Face OlmoeForCausalLM has no equivalent of model.moe.bias_update_rate=0.001; use --format "
     "safetensors"),
    (["model=olmoe-1b-7b", "model.moe.n_dense_layers=1"],
     "Hugging Face OlmoeForCausalLM has every layer sparse, but this model has model.moe.n_dense_layers=1 and "
     "model.moe.sparse_every=1; use --format safetensors"),
    (["model=olmoe-1b-7b", "model.head_dim=64", "model.n_heads=8", "model.n_kv_heads=8"],
     "Hugging Face OlmoeForCausalLM needs n_heads x head_dim = d_model, but this model has 8 x 64 != d_model 2048; "
     "use --format safetensors"),
])
def test_export_refuses_what_the_hugging_face_class_cannot_hold(overrides, message):
    assert refusal(check_hf_exportable, compose_config(overrides).model) == ("--format", message)


@pytest.mark.parametrize("name", ["qwen3-0.6b", "qwen3-8b", "qwen3-moe-30b-a3b", "olmoe-1b-7b"])
def test_builtin_sizes_export(name):
    check_hf_exportable(compose_config([f"model={name}"]).model)


def test_both_qwen3_model_types_are_read_by_the_qwen3_family():
    assert family_for_hf_type("qwen3") is family_for_hf_type("qwen3_moe") is family("qwen3")
    assert family_for_hf_type("olmoe") is family("olmoe")


def written_config(*overrides: str) -> tuple[dict, object]:
    m = compose_config(list(overrides)).model
    return family(m.arch).hf_adapter().hf_config(m), m


def test_a_written_config_json_passes_its_own_check():
    for name in ("qwen3-0.6b", "qwen3-moe-30b-a3b", "olmoe-1b-7b"):
        conf, m = written_config(f"model={name}")
        family(m.arch).hf_adapter().check_hf_config(conf, CONF, m)


@pytest.mark.parametrize("changes, overrides, message", [
    ({"num_experts_per_tok": 4}, [], "has num_experts_per_tok=4 but model.moe.top_k=8; set model.moe.top_k=4"),
    ({"num_experts": 64}, [], "has num_experts=64 but model.moe.n_experts=128; set model.moe.n_experts=64"),
    ({"norm_topk_prob": False}, [],
     "has norm_topk_prob=false but model.moe.norm_topk_prob=True; set model.moe.norm_topk_prob=false"),
    ({"decoder_sparse_step": 2}, [], "has decoder_sparse_step=2 but model.moe.sparse_every=1; set "
                                     "model.moe.sparse_every=2"),
    ({"mlp_only_layers": [0, 1]}, [], "has mlp_only_layers=[0, 1] but model.moe.n_dense_layers=0; set "
                                      "model.moe.n_dense_layers=2"),
    ({"mlp_only_layers": [3]}, [], "has mlp_only_layers=[3] but llmtrain keeps only the first layers dense "
                                   "(model.moe.n_dense_layers)"),
    ({"use_sliding_window": True}, [], "has use_sliding_window=true but llmtrain's Qwen3 attends to the whole "
                                       "context"),
    ({"model_type": "qwen3"}, [], "has model_type qwen3 (dense) but model.moe is set; set model.moe=null"),
    ({}, ["model.moe=null"], "has model_type qwen3_moe (a mixture of experts) but model.moe is null; set model.moe "
                             "(n_experts, top_k, expert_ffn_dim)"),
])
def test_qwen3_moe_config_json_what_shapes_cannot_tell(changes, overrides, message):
    conf, _ = written_config("model=qwen3-moe-30b-a3b")
    _, m = written_config("model=qwen3-moe-30b-a3b", *overrides)
    conf.update(changes)
    assert refusal(family("qwen3").hf_adapter().check_hf_config, conf, CONF, m) == \
        ("model.init_from", f"{CONF} {message}")


def test_olmoe_config_json_with_clipped_qkv_is_refused():
    conf, m = written_config("model=olmoe-1b-7b")
    conf["clip_qkv"] = 8.0
    assert refusal(family("olmoe").hf_adapter().check_hf_config, conf, CONF, m) == \
        ("model.init_from", f"{CONF} has clip_qkv=8.0 but llmtrain's OLMoE does not clip q, k and v")


def test_olmoe_norm_shapes_name_the_head_counts():
    spec = family("olmoe")
    assert spec.shape_key("attn.q_norm.weight", 0) == "model.n_heads"
    assert spec.shape_key("attn.k_norm.weight", 0) == "model.n_kv_heads"
    assert family("qwen3").shape_key("attn.k_norm.weight", 0) == "model.head_dim"
