"""A MoE model's bookkeeping around a step (llmtrain/train/moe_step.py): the metrics row's expert fields from the
reduced statistics (and under expert parallel each ep rank's share), the router bias balancing, the aux-loss factor the blocks are given, the console line, the
trackers' scalars, and fp8 leaving routers out."""

from __future__ import annotations

import pytest
import torch

from llmtrain.config import compose_config
from llmtrain.train.moe_step import MoEStep, layer_metrics
from llmtrain.train.step_log import moe_words
from llmtrain.train.trackers.base import scalars

E = 4


def test_layer_metrics_from_a_reduced_table():
    # Two sparse layers (global indices 1 and 3), 4 experts: tokens per expert, aux sum, z sum, calls.
    table = [[6.0, 2.0, 0.0, 0.0, 2.5, 0.5, 2.0],
             [2.0, 2.0, 2.0, 2.0, 4.0, 1.0, 4.0]]
    got = layer_metrics([1, 3], table, E)
    assert got == {"aux_loss": (1.25 + 1.0) / 2, "router_z_loss": (0.25 + 0.25) / 2, "moe_layers": [1, 3],
                   "expert_load": [6 * 4 / 8, 1.0], "experts_idle": [2, 0],
                   "expert_tokens": [[6, 2, 0, 0], [2, 2, 2, 2]]}


def test_one_busy_expert_is_a_load_of_n_experts_exactly():
    got = layer_metrics([0], [[0.0, 0.0, 4096.0 * 3, 0.0, 4.0, 0.0, 1.0]], E)
    assert got["expert_load"] == [4.0] and got["experts_idle"] == [3]


def test_a_layer_without_tokens_reads_zero_not_nan():
    got = layer_metrics([0], [[0.0] * (E + 3)], E)
    assert got["expert_load"] == [0.0] and got["aux_loss"] == 0.0 and got["experts_idle"] == [4]


def test_console_words_show_aux_loss_and_the_worst_layer():
    row = {"aux_loss": 2.01234, "expert_load": [1.5, 3.456, 2.0]}
    assert moe_words(row) == " | aux_loss 2.0123 | expert_load 3.46"
    assert moe_words({"loss": 1.0}) == ""


# Two sparse layers of 8 experts: an uneven layer, and a layer whose tokens all went to experts 6 and 7.
EP_TABLE = [[6.0, 3.0, 0.0, 0.0, 2.0, 6.0, 4.0, 3.0, 0.0, 0.0, 1.0],
            [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 10.0, 6.0, 0.0, 0.0, 1.0]]


def test_ep2_rows_add_each_ep_ranks_pairs_and_the_busiest_over_the_mean():
    got = layer_metrics([1, 3], EP_TABLE, 8, ep=2)
    # Rank 0 holds experts 0-3, rank 1 experts 4-7; the second layer's rank 0 gets nothing: a load of ep.
    assert got["ep_tokens"] == [[9, 15], [0, 16]]
    assert got["ep_load"] == [15 * 2 / 24, 2.0]
    assert {k: v for k, v in got.items() if not k.startswith("ep_")} == layer_metrics([1, 3], EP_TABLE, 8)


def test_ep4_rows_split_the_experts_in_four():
    got = layer_metrics([1, 3], EP_TABLE, 8, ep=4)
    assert got["ep_tokens"] == [[9, 0, 8, 7], [0, 0, 0, 16]]
    assert got["ep_load"] == [9 * 4 / 24, 4.0]


def test_ep1_rows_have_no_ep_keys():
    assert set(layer_metrics([1, 3], EP_TABLE, 8)) == set(layer_metrics([1, 3], EP_TABLE, 8, ep=1)) == {
        "aux_loss", "router_z_loss", "moe_layers", "expert_load", "experts_idle", "expert_tokens"}


def test_an_ep_layer_without_tokens_reads_zero_not_nan():
    got = layer_metrics([0], [[0.0] * 11], 8, ep=2)
    assert got["ep_tokens"] == [[0, 0]] and got["ep_load"] == [0.0]


def test_console_words_add_the_worst_layers_ep_load_and_its_busiest_rank():
    row = {"aux_loss": 2.01234, "expert_load": [1.5, 3.456], "ep_load": [1.3125, 1.25],
           "ep_tokens": [[20, 34, 42, 32], [24, 40, 24, 40]]}
    assert moe_words(row) == " | aux_loss 2.0123 | expert_load 3.46 | ep_load 1.31 (rank 2 busiest)"
    row.update(ep_load=[1.0, 2.0], ep_tokens=[[8, 8], [8, 8]])
    assert moe_words(row).endswith(" | ep_load 2.00 (rank 0 busiest)")  # equals: the lowest rank


def test_trackers_get_a_scalar_per_sparse_layer():
    row = {"step": 3, "loss": 2.0, "aux_loss": 2.1, "router_z_loss": 0.5, "moe_layers": [1, 3],
           "expert_load": [1.5, 2.0], "experts_idle": [0, 1], "expert_tokens": [[1, 2], [3, 0]],
           "ep_load": [1.25, 2.0], "ep_tokens": [[1, 2], [3, 0]]}
    assert scalars(row) == {"train/loss": 2.0, "train/aux_loss": 2.1, "train/router_z_loss": 0.5,
                            "expert_load/layer_1": 1.5, "expert_load/layer_3": 2.0,
                            "experts_idle/layer_1": 0, "experts_idle/layer_3": 1,
                            "ep_load/layer_1": 1.25, "ep_load/layer_3": 2.0}


# ---- with MoE blocks ----------------------------------------------------------------------------------------------

def _part(rate: float = 0.0) -> torch.nn.Module:
    """A model part holding sparse layers 1 and 3 (global indices), 4 experts, top 1."""
    from llmtrain.model.moe import MoE, MoEArgs

    args = MoEArgs(n_experts=E, top_k=1, ffn=8, bias_update_rate=rate)
    part = torch.nn.Module()
    part.layers = torch.nn.ModuleDict({str(i): torch.nn.Module() for i in (1, 3)})
    for key, block in part.layers.items():
        block.mlp = MoE(16, args, int(key))
        torch.nn.init.normal_(block.mlp.router.weight, std=0.1)
        block.mlp.reset_buffers()
    return part


def _routed(part, ep: int = 1) -> MoEStep:
    step = MoEStep([part], [1, 3], E, part.layers["1"].mlp.args.bias_update_rate, None, torch.device("cpu"), ep=ep)
    step.start(0.25)
    for block in part.layers.values():
        block.mlp.router_bias[2] = 100.0  # every token to expert 2
        block.mlp(torch.randn(2, 5, 16))
    return step


def test_start_zeroes_the_statistics_and_sets_the_loss_factor():
    part = _part()
    step = _routed(part)
    step.start(0.125)
    for block in part.layers.values():
        m = block.mlp
        assert m.aux_loss_scale.item() == 0.125
        assert m.tokens_per_expert.tolist() == [0] * E and m.calls.item() == 0 and m.aux_sum.item() == 0


def test_a_logged_step_reports_every_sparse_layer():
    got = _routed(_part()).finish(logged=True, skipped=False)
    assert got["moe_layers"] == [1, 3] and got["expert_tokens"] == [[0, 0, 10, 0]] * 2
    assert got["expert_load"] == [4.0, 4.0] and got["experts_idle"] == [3, 3]


def test_an_ep_step_reports_the_ep_ranks_and_an_ep1_step_does_not():
    got = _routed(_part(), ep=2).finish(logged=True, skipped=False)
    assert got["ep_tokens"] == [[0, 10]] * 2 and got["ep_load"] == [2.0, 2.0]  # expert 2 is rank 1's
    assert "ep_tokens" not in _routed(_part()).finish(logged=True, skipped=False)


def test_build_passes_the_ep_of_the_parallel_dims():
    from types import SimpleNamespace

    cfg = compose_config(["model=moe-tiny"])
    dims = SimpleNamespace(dp=1, cp=1, pp=1, ep=2)  # one rank: no reduction group, so no mesh is needed
    assert MoEStep.build(cfg, [], None, dims, torch.device("cpu")).ep == 2


def test_without_bias_balancing_an_unlogged_step_reduces_nothing(monkeypatch):
    step = _routed(_part())
    monkeypatch.setattr(step, "_reduced_table", lambda: pytest.fail("reduced on an unlogged step"))
    assert step.finish(logged=False, skipped=False) is None


@pytest.mark.parametrize("skipped", [False, True])
def test_bias_balancing_follows_the_summed_counts_unless_the_step_was_skipped(skipped):
    part = _part(rate=0.5)
    assert _routed(part).finish(logged=False, skipped=skipped) is None
    want = [0.0, 0.0, 100.0, 0.0] if skipped else [0.5, 0.5, 99.5, 0.5]
    for block in part.layers.values():
        assert block.mlp.router_bias.tolist() == want


def test_the_factor_is_what_the_lm_loss_is_multiplied_by():
    """Plain steps scale each micro-batch's loss by 1/accum x the fp16 scale; a pipeline's loss function by the
    scale alone (its schedule divides the gradients by the micro-batches)."""
    from types import SimpleNamespace

    from llmtrain.train.loss_scale import DynamicLossScaler
    from llmtrain.train.trainer import Trainer

    def factor(pipeline, fp16):
        scaler = DynamicLossScaler(1024.0, 2.0, 0.5, 100, enabled=fp16)
        trainer = SimpleNamespace(scaler=scaler, accum=4, model=SimpleNamespace(pipeline=pipeline))
        return Trainer.loss_factor(trainer)

    assert [factor(None, False), factor(None, True), factor(object(), False), factor(object(), True)] == \
        [0.25, 256.0, 1.0, 1024.0]


def test_a_pipeline_stages_shape_inference_leaves_the_statistics_alone():
    from llmtrain.parallel.pipeline import keep_inference_out_of_moe_stats

    part = _part()
    _routed(part)
    stage = SimpleStage(part)
    keep_inference_out_of_moe_stats(stage)
    assert stage._forward_metadata_inference(torch.randn(3, 5, 16)) == "shapes"
    assert [b.mlp.tokens_per_expert.tolist() for b in part.layers.values()] == [[0, 0, 10, 0]] * 2
    assert [b.mlp.calls.item() for b in part.layers.values()] == [1, 1]


class SimpleStage:
    """What keep_inference_out_of_moe_stats sees of a PipelineStage: its module and its shape inference, which
    runs the module's forward."""

    def __init__(self, submod):
        self.submod = submod

    def _forward_metadata_inference(self, x):
        for block in self.submod.layers.values():
            block.mlp(x)
        return "shapes"


def test_fp8_leaves_routers_and_routed_experts_out():
    pytest.importorskip("torchao")
    from torchao.float8.float8_linear import Float8Linear

    from llmtrain.model import build_model
    from llmtrain.parallel.float8 import Float8Training

    cfg = compose_config(["model=moe-tiny"])
    with torch.device("meta"):
        model = build_model(cfg.model)
    fp8 = Float8Training("tensorwise", fsdp_float8_all_gather=False, tensor_parallel_styles=False)
    fp8.convert(model)
    kinds = {name: type(m).__name__ for name, m in model.layers.named_modules()}
    assert kinds["1.mlp.router"] == "Linear" and kinds["1.mlp.shared.fc"] == "Float8Linear"
    assert kinds["0.mlp.fc"] == kinds["1.attn.q"] == "Float8Linear"
    # Per layer q, k, v, proj; layer 0's dense gate/fc/proj; the 3 sparse layers' shared gate/fc/proj.
    assert fp8.converted == sum(isinstance(m, Float8Linear) for m in model.modules()) == 4 * 4 + 3 + 3 * 3
    assert fp8.routers_kept == 3
    assert "MoE routers and routed experts in bf16 (torchao's grouped float8 is not used)" in fp8.describe(True)
