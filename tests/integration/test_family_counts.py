"""The built-in Qwen3 and OLMoE sizes have the published parameter counts three ways: transformers' model built
from the config.json the family's adapter writes, llmtrain's model, and `llmtrain plan`'s counter (total and
active). Everything on the meta device: no memory, no initialization."""

from __future__ import annotations

import pytest
import torch
import yaml

from llmtrain.config import builtin_config_dir, compose_config
from llmtrain.config.derived import padded_vocab_size
from llmtrain.model import build_model
from llmtrain.model.registry import family_of
from llmtrain.plan.params import active_params, stage_params

transformers = pytest.importorskip("transformers", reason="transformers not installed: pip install transformers")

# (total, active per token) of the published checkpoints (Qwen/Qwen3-*, allenai/OLMoE-1B-7B-0924); a dense model's
# every parameter is active.
PUBLISHED = {
    "qwen3-0.6b": (596_049_920, 596_049_920),
    "qwen3-1.7b": (1_720_574_976, 1_720_574_976),
    "qwen3-8b": (8_190_735_360, 8_190_735_360),
    "qwen3-moe-30b-a3b": (30_532_122_624, 3_353_032_704),
    "olmoe-1b-7b": (6_919_161_856, 1_282_017_280),
}
HF_CLASSES = {"qwen3-moe-30b-a3b": "Qwen3MoeForCausalLM", "olmoe-1b-7b": "OlmoeForCausalLM"}


def test_every_builtin_qwen3_and_olmoe_size_has_a_published_count():
    sizes = {p.stem for p in (builtin_config_dir() / "model").glob("*.yaml")
             if yaml.safe_load(p.read_text()).get("arch") in ("qwen3", "olmoe")}
    assert sizes == set(PUBLISHED) | {"moe-tiny"}


def meta_count(model) -> int:
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name", PUBLISHED)
def test_transformers_llmtrain_and_the_plan_count_the_published_parameters(name):
    cfg = compose_config([f"model={name}"])
    total, active = PUBLISHED[name]
    conf = family_of(cfg.model).hf_adapter().hf_config(cfg.model)
    assert conf["architectures"] == [HF_CLASSES.get(name, "Qwen3ForCausalLM")]
    hf_conf = transformers.AutoConfig.for_model(**conf)
    with torch.device("meta"):
        theirs = transformers.AutoModelForCausalLM.from_config(hf_conf)
        ours = build_model(cfg.model)
    assert type(theirs).__name__ == conf["architectures"][0]
    assert (meta_count(theirs), meta_count(ours)) == (total, total)
    # The embedding has exactly the published rows: no padding (vocab_pad_multiple divides them).
    assert ours.embed.tok.weight.shape[0] == padded_vocab_size(cfg.model) == hf_conf.vocab_size
    _, plan_total, _ = stage_params(cfg)
    assert (plan_total, active_params(cfg)) == (total, active)


def test_moe_tiny_is_a_small_qwen3_with_one_dense_layer_and_a_shared_expert():
    cfg = compose_config(["model=moe-tiny"])
    model = build_model(cfg.model)
    names = dict(model.named_parameters())
    assert "layers.0.mlp.gate.weight" in names and "layers.0.mlp.router.weight" not in names
    assert [names[f"layers.{i}.mlp.experts.gate"].shape for i in (1, 2, 3)] == [(8, 64, 128)] * 3
    assert names["layers.1.mlp.shared.fc.weight"].shape == (64, 128)
    assert names["layers.3.attn.q_norm.weight"].shape == (32,)
    assert meta_count(model) == stage_params(cfg)[1] == 1_044_864
    assert active_params(cfg) == 1_044_864 - 3 * 6 * 3 * 64 * 128  # 6 of 8 experts idle in each sparse layer
