"""The model-family seam (model/family.py, registry.py, each family's SPEC): what config, fp8, init and the
planner read from a family instead of testing its name, and model.moe's checks."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch
from torch import nn

from llmtrain.config.compose import compose_config
from llmtrain.config.derived import ffn_dim, kv_heads
from llmtrain.config.errors import ConfigError
from llmtrain.config.fp8 import float8_weights_per_block, shape_problem
from llmtrain.config.validate import validate
from llmtrain.model.init import full_init_value, init_parameters, parameter_seed
from llmtrain.model.registry import FAMILIES, family, family_for_hf_type

MOE = "model.moe={n_experts:4,top_k:2,expert_ffn_dim:64,n_shared_experts:1,n_dense_layers:1}"


def _refusal(*overrides: str) -> str:
    with pytest.raises(ConfigError) as e:
        validate(compose_config(list(overrides)))
    return str(e.value)


def test_the_registry_names_each_family_by_its_arch_and_hf_type():
    assert FAMILIES[:2] == ("gpt2", "llama")
    assert [family(name).name for name in FAMILIES] == list(FAMILIES)
    assert family_for_hf_type("llama") is family("llama") and family_for_hf_type("gpt2") is family("gpt2")
    assert family_for_hf_type("bert") is None
    assert (family("gpt2").calibration, family("llama").calibration) == ("gpt", "llama")  # saved fits still apply


def test_config_and_the_specs_load_without_torch():
    code = ("import sys, llmtrain.config.validate, llmtrain.config.fp8, llmtrain.model, llmtrain.model.registry as r\n"
            "[r.family(a) for a in r.FAMILIES]\nprint('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "False\n"


def test_widths_come_from_the_family():
    gpt2 = compose_config([]).model
    assert (ffn_dim(gpt2), kv_heads(gpt2)) == (512, 4)
    llama_3_8b = compose_config(["model=llama-tiny", "model.d_model=4096", "model.n_heads=32", "model.n_kv_heads=8",
                                 "model.ffn_dim_multiplier=1.3", "model.multiple_of=1024"]).model
    assert (ffn_dim(llama_3_8b), kv_heads(llama_3_8b)) == (14336, 8)


def test_another_familys_key_is_refused_with_todays_words():
    assert _refusal("model.n_kv_heads=2") == ("model.n_kv_heads: is a model.arch=llama setting and this model is "
                                              "model.arch=gpt2; remove it (default None) or set model.arch=llama")
    assert _refusal("model=llama-tiny", "model.dropout=0.1") == (
        "model.dropout: is a model.arch=gpt2 setting and this model is model.arch=llama; remove it (default 0.0) or "
        "set model.arch=gpt2")


def test_a_llama_rule_lives_in_its_spec():
    assert _refusal("model=llama-tiny", "model.head_dim=15") == (
        "model.head_dim: rotary positions pair a head's dimensions, so the head width must be even (got 15)")


def test_model_moe_is_refused_by_a_family_without_experts():
    assert _refusal(MOE).startswith("model.moe: model.arch=gpt2 has no mixture-of-experts blocks; remove model.moe")


@pytest.mark.parametrize("moe, message", [
    ("{n_experts:4,top_k:5}", "model.moe.top_k: must be <= model.moe.n_experts=4 (got 5)"),
    ("{n_experts:0}", "model.moe.n_experts: must be > 0 (got 0)"),
    ("{sparse_every:0}", "model.moe.sparse_every: must be > 0 (got 0)"),
    ("{n_dense_layers:5}", "model.moe.n_dense_layers: must be in [0, model.n_layers=4] (got 5)"),
    ("{router_aux_loss_coef:-0.1}", "model.moe.router_aux_loss_coef: must be >= 0 (got -0.1)"),
    ("{expert_ffn_dim:0}", "model.moe.expert_ffn_dim: must be > 0 (got 0)"),
    ("{score_func:relu}", "model.moe.score_func: must be one of softmax, sigmoid (got relu)"),
    ("{grouped_mm:yes}", "model.moe.grouped_mm: must be one of auto, on, off (got yes)"),
])
def test_each_moe_rule_is_one_line_naming_its_key(moe, message):
    assert _refusal("model=llama-tiny", "model.n_layers=4", f"model.moe={moe}") == message


def test_a_field_of_the_unset_moe_section_says_to_set_it_whole():
    assert _refusal("model.moe.top_k=4") == ("model.moe.top_k: model.moe is null here; set the section whole: "
                                             "model.moe={top_k:...} (its other fields take their defaults)")


def test_block_shapes_follow_the_layer():
    cfg = compose_config(["model=llama-tiny", MOE])
    validate(cfg)
    spec, m = family("llama"), cfg.model
    dense, sparse = spec.block_shape(m, 0), spec.block_shape(m, 1)
    assert (dense.sparse, dense.gated, dense.biases, dense.rotary, dense.rms_norm) == (False, True, False, True, True)
    assert (sparse.experts, sparse.top_k, sparse.expert_ffn, sparse.shared_ffn) == (4, 2, 64, 64)
    gpt2 = family("gpt2").block_shape(compose_config([]).model)
    assert (gpt2.gated, gpt2.biases, gpt2.rotary, gpt2.ffn) == (False, True, False, 512)


def test_float8_counts_dense_matrices_and_a_sparse_blocks_shared_expert_only():
    cfg = compose_config(["model=llama-tiny", "model.n_layers=2", MOE, "precision=fp8"])
    m, d = cfg.model, cfg.model.d_model
    attention = d * (2 * m.n_heads * 32 + 2 * kv_heads(m) * 32)  # llama-tiny's heads are 32 wide
    dense, sparse = attention + 3 * d * ffn_dim(m), attention + 3 * d * 64  # experts and router left out
    assert float8_weights_per_block(cfg) == (dense + sparse) // 2
    dense_only = compose_config(["model=llama-tiny", "model.n_layers=2", "precision=fp8"])
    assert float8_weights_per_block(dense_only) == dense
    gpt2 = compose_config([]).model
    assert family("gpt2").mlp_width_key(gpt2) == "the MLP width (4 x d_model)"
    assert "the MLP width (model.ffn_dim) is 520;" in shape_problem(compose_config(["model.ffn_dim=520",
                                                                                     "precision=fp8"]))
    shared = compose_config(["model=llama-tiny", "model.ffn_dim=520", "precision=fp8", "model.moe={n_experts:4,"
                             "expert_ffn_dim:72,n_shared_experts:1}"])
    # every block sparse: no dense MLP to check; the shared expert is a float8 layer, the routed experts are not
    assert "the shared experts' width (model.moe.n_shared_experts x expert width) is 72;" in shape_problem(shared)


@pytest.mark.parametrize("arch, leaf, dim, key", [
    ("llama", "attn.k.weight", 0, "model.n_kv_heads"),
    ("gpt2", "attn.k.weight", 0, "model.n_heads"),
    ("gpt2", "attn.v.bias", 0, "model.n_heads"),
    ("llama", "mlp.proj.weight", 1, "model.ffn_dim"),
    ("gpt2", "mlp.fc.weight", 0, "model.d_model"),
    ("llama", "attn.q_norm.weight", 0, "model.head_dim"),
    ("llama", "mlp.router.weight", 0, "model.moe.n_experts"),
    ("llama", "mlp.experts.gate", 0, "model.moe.n_experts"),
    ("llama", "mlp.experts.gate", 1, "model.moe.expert_ffn_dim"),
    ("llama", "mlp.experts.proj", 1, "model.d_model"),
    ("llama", "mlp.experts.proj", 2, "model.moe.expert_ffn_dim"),
    ("llama", "mlp.shared.fc.weight", 0, "model.moe.n_shared_experts"),
    ("llama", "mlp.shared.proj.weight", 1, "model.moe.n_shared_experts"),
    ("llama", "mlp.shared.proj.weight", 0, "model.d_model"),
])
def test_a_shape_mismatch_names_the_key_that_sets_the_dimension(arch, leaf, dim, key):
    assert family(arch).shape_key(leaf, dim) == key


def _draw(name: str, shape: tuple, std: float) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(parameter_seed(7, name))) * std


def test_new_parameter_names_get_their_init_and_old_ones_keep_theirs():
    shape, n = (4, 8, 3), 6
    assert torch.equal(full_init_value("layers.0.attn.q_norm.weight", (8,), 7, 0.02, n), torch.ones(8))
    assert torch.equal(full_init_value("layers.0.attn.k_norm.weight", (8,), 7, 0.02, n), torch.ones(8))
    for residual in ("layers.1.mlp.experts.proj", "layers.1.mlp.shared.proj.weight", "layers.1.mlp.proj.weight"):
        value = full_init_value(residual, shape, 7, 0.02, n)
        assert torch.equal(value, _draw(residual, shape, 0.02 / math.sqrt(2 * n))), residual
    for plain in ("layers.1.mlp.experts.gate", "layers.1.mlp.router.weight", "layers.0.mlp.fc.weight"):
        assert torch.equal(full_init_value(plain, shape, 7, 0.02, n), _draw(plain, shape, 0.02)), plain


class _WithBuffers(nn.Module):
    def __init__(self):
        super().__init__()
        self.args = type("Args", (), {"tie_embeddings": False})()
        self.lin = nn.Linear(2, 2)
        self.register_buffer("count", torch.full((3,), 5.0))

    def reset_buffers(self):
        self.count.zero_()


def test_init_resets_every_modules_buffers():
    model = _WithBuffers()
    init_parameters(model, seed=7, std=0.02, n_layers=1)
    assert torch.equal(model.count, torch.zeros(3))
