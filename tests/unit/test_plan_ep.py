"""`llmtrain plan` under expert parallel (`parallel.ep`): each rank holds 1/ep of the routed experts, ZeRO-sharded
over the ranks holding the same ones; its activations stay as at ep=1; the all-to-alls' bytes and their exposed
time; `--suggest` and the smallest fitting change rank ep too."""

from __future__ import annotations

import json

import pytest
from helpers.sweep_tables import table_rows

from llmtrain.cli import main
from llmtrain.config import compose_config
from llmtrain.plan.cli import layouts
from llmtrain.plan.estimate import build_plan
from llmtrain.plan.expert_parallel import all_to_all_bytes, layer_all_to_all_bytes
from llmtrain.plan.params import block_shape, stage_params

# Timed at a made-up peak; "cpu" keeps the memory on the CPU terms (no CUDA autocast model) whatever the precision.
HW = {"name": "cpu", "peak_tflops": 100.0, "memory_gib": None, "intra_node_gbs": 400.0, "inter_node_gbs": 50.0,
      "efficiency": 0.5}
# moe-tiny (layer 0 dense, 1-3 sparse: 8 experts of 3 x 128 x 64, 2 per token) on 4 ranks, 2 micro-batches of 2.
TINY = ["model=moe-tiny", "cluster.nproc_per_node=4", "train.micro_batch_size=2", "train.global_batch_size=16",
        "precision=bf16"]
ROUTED = 3 * 8 * 3 * 128 * 64  # the routed experts' parameters: 589,824
# One sparse layer, one micro-batch of 2 x 128 tokens, 2 pairs each, rows of 128 bf16 values; counts: 8 int64.
ROWS = 2 * 128 * 2 * 128 * 2
FORWARD = 8 * 8 + 2 * ROWS
LAYER = FORWARD + 2 * ROWS  # 524,352


@pytest.fixture(autouse=True)
def wide(monkeypatch, tmp_path):
    monkeypatch.setenv("COLUMNS", "250")
    monkeypatch.setenv("LLMTRAIN_CACHE", str(tmp_path / "cache"))  # uncalibrated


def _plan(*overrides):
    cfg = compose_config([*TINY, *overrides])
    return cfg, build_plan(cfg, 100e12, None, HW)


def test_parameters_per_rank_hold_one_ep_th_of_the_routed_experts():
    whole = stage_params(compose_config(TINY))[0][0].params_per_rank
    assert whole == 1_044_864
    for ep in (1, 2, 4):
        stage = stage_params(compose_config([*TINY, f"parallel.ep={ep}"]))[0][0]
        assert stage.expert_params_per_rank == ROUTED // ep
        assert stage.params_per_rank == whole - ROUTED + ROUTED // ep


@pytest.mark.parametrize("zero", [0, 2, 3])
@pytest.mark.parametrize("ep", [1, 2, 4])
def test_model_state_per_rank_splits_the_experts_over_ep_then_their_zero_group(zero, ep):
    """fp32 weights (4 bytes), gradients (4) and AdamW moments (8): the rest over dp_shard = 4 (zero 2/3), the
    rank's ROUTED / ep experts over expert_dp_shard = 4 / ep; zero 2 gathers its whole stage in bf16 (zero 0 too:
    FSDP2 replicates through unsharded copies), zero 3 about two of the 4 blocks, and experts held by one rank alone
    (ep = dp) are not gathered."""
    _, plan = _plan(f"parallel.zero={zero}", f"parallel.ep={ep}")
    rest, experts = 1_044_864 - ROUTED, ROUTED // ep
    shard, expert_shard = (4, 4 // ep) if zero else (1, 1)
    expected = {"params": (rest / shard + experts / expert_shard) * 4 if zero else (rest + experts) * 4,
                "grads": (rest / shard + experts / expert_shard) * 4,
                "optimizer": (rest / shard + experts / expert_shard) * 8}
    gathered = {0: 2.0, 2: 2.0, 3: 2.0 * 2 / 4}[zero]  # bytes per parameter: bf16, whole or two blocks of four
    expected["gathered_params"] = gathered * (rest + (experts if ep < 4 else 0))
    assert plan.stages[0].state_bytes == pytest.approx(expected, rel=1e-12)
    assert plan.dims["ep"] == ep


def test_activations_stay_as_at_ep_1_and_the_peak_moves_by_the_state_alone():
    """A rank computes the pairs it receives: on average its own tokens x top_k, as without expert parallel."""
    _, one = _plan("parallel.zero=0")
    _, four = _plan("parallel.zero=0", "parallel.ep=4")
    assert four.stages[0].activation_bytes == one.stages[0].activation_bytes
    # zero 0: every byte of the 3/4 of the experts a rank no longer holds (weights, grads, moments: 16 bytes), and
    # the bf16 copies FSDP2 replicates every expert through at ep=1 (at ep=4 = dp each rank holds its own alone)
    assert one.peak_bytes_per_rank - four.peak_bytes_per_rank == pytest.approx(16 * ROUTED * 3 / 4 + 2 * ROUTED,
                                                                               rel=1e-12)


def test_all_to_all_bytes_per_layer_and_step():
    shape = block_shape(compose_config(TINY).model, 1)
    assert layer_all_to_all_bytes(shape, 256, 2, recomputed=False) == LAYER == 524_352
    assert layer_all_to_all_bytes(shape, 256, 2, recomputed=True) == LAYER + FORWARD
    cfg, plan = _plan("parallel.ep=4")
    assert plan.all_to_all_bytes_per_step == 2 * 3 * LAYER  # 2 micro-batches x 3 sparse layers
    # the 3/4 that leaves the rank, at one node's links (4 x pp 1 x tp 1 ranks inside a 4-rank node), exposed
    assert plan.all_to_all_s == 2 * 3 * LAYER * 3 / 4 / 400e9
    assert plan.exposed_comm_s == pytest.approx(plan.comm_bytes_per_step["dp"] / 400e9 / 4 + plan.all_to_all_s)
    assert _plan()[1].all_to_all_bytes_per_step == 0.0 == _plan()[1].all_to_all_s
    # full recompute runs every block's forward all-to-alls again; recompute.every=2 only block 2's (sparse)
    assert _plan("parallel.ep=4", "recompute=full")[1].all_to_all_bytes_per_step == 2 * 3 * (LAYER + FORWARD)
    every2 = _plan("parallel.ep=4", "recompute=full", "recompute.every=2")[1]
    assert every2.all_to_all_bytes_per_step == 2 * (3 * LAYER + FORWARD)
    assert _plan("parallel.ep=4", "recompute=selective")[1].all_to_all_bytes_per_step == 2 * 3 * LAYER
    assert all_to_all_bytes(cfg, [0], 2, []) == 0.0  # the dense layer has none


def test_all_to_all_follows_the_busiest_stage_the_whole_tp_input_and_the_links_between_nodes():
    # pp 2, layers [2, 2]: stage 1 holds sparse layers 2 and 3; dp 4 = ep 4 spans 8 ranks: one 8-rank node
    _, inside = _plan("cluster.nproc_per_node=8", "parallel.pp=2", "parallel.ep=4")
    assert inside.all_to_all_bytes_per_step == 2 * 2 * LAYER
    assert inside.all_to_all_s == 2 * 2 * LAYER * 3 / 4 / 400e9
    _, across = _plan("cluster.nproc_per_node=4", "cluster.nnodes=2", "parallel.pp=2", "parallel.ep=4")
    assert across.all_to_all_s == 2 * 2 * LAYER * 3 / 4 / 50e9
    # tp 2: every tp rank dispatches the micro-batch's tokens whole; dp 2 = ep 2 (1/2 leaves), 4 micro-batches
    _, tp = _plan("parallel.tp=2", "parallel.ep=2")
    assert tp.all_to_all_bytes_per_step == 4 * 3 * LAYER
    assert tp.all_to_all_s == 4 * 3 * LAYER / 2 / 400e9


def test_the_plan_shows_ep_and_the_all_to_all(capsys):
    assert main(["plan", *TINY, "hardware=h100", "parallel.zero=3", "parallel.ep=4"]) == 0
    rows = dict(r[:2] for r in table_rows(capsys.readouterr().out) if len(r) >= 2)
    assert rows["layout"] == "dp=4 (shard 4) cp=1 tp=1 pp=1 x v1 ep=4 zero=3 schedule=1f1b recompute=none"
    assert rows["all-to-all per step"] == ("0.003 GB per rank (3/4 of it leaves the rank: est. 0.000 s, "
                                           "exposed)")
    assert main(["plan", *TINY, "hardware=h100", "parallel.ep=4", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["all_to_all_bytes_per_step"] == 3_146_112 and plan["dims"]["ep"] == 4
    assert plan["all_to_all_s"] == pytest.approx(3_146_112 * 3 / 4 / 450e9)
    assert main(["plan", *TINY, "hardware=h100"]) == 0
    rows = dict(r[:2] for r in table_rows(capsys.readouterr().out) if len(r) >= 2)
    assert rows["all-to-all per step"] == "none (ep=1: every rank holds every expert)"
    assert main(["plan", "hardware=h100"]) == 0  # a dense model: no such row, ep=1 in the layout
    rows = dict(r[:2] for r in table_rows(capsys.readouterr().out) if len(r) >= 2)
    assert "all-to-all per step" not in rows and " ep=1 " in rows["layout"]


def test_suggest_candidates_take_every_ep_that_divides_the_experts_and_dp():
    moe = compose_config(["model=moe-tiny"])
    assert sorted({(tp, ep) for tp, pp, _, _, ep in layouts(moe, 8, 8) if pp == 1}) == [
        (1, 1), (1, 2), (1, 4), (1, 8), (2, 1), (2, 2), (2, 4), (4, 1), (4, 2), (8, 1)]
    assert {layout[4] for layout in layouts(compose_config([]), 8, 8)} == {1}  # a dense model


QWEN = ["model=qwen3-moe-30b-a3b", "hardware=h100", "precision=bf16", "train.micro_batch_size=1",
        "train.global_batch_size=64"]


def test_suggest_picks_expert_parallel_when_the_experts_do_not_fit_otherwise(capsys):
    """qwen3-moe-30b-a3b on 8 devices: ZeRO-3 with full recompute needs 63.12 GiB at ep=1 (on 80 GiB devices the
    fastest layout: the all-to-alls cost more time than the experts' gathers they save); on 61.5 GiB devices no ep=1
    layout without context parallel fits, and expert parallel's smaller expert gathers make ep=2 the fastest that
    does (context parallel, at ep=1, fits too: its own search)."""
    assert main(["plan", *QWEN, "--suggest", "8", "61.5", "--json"]) == 0
    plans = [p for p in json.loads(capsys.readouterr().out) if p["dims"]["cp"] == 1]
    assert plans and all(p["dims"]["ep"] > 1 and p["peak_bytes_per_rank"] <= 61.5 * 2**30 for p in plans)
    assert (plans[0]["dims"]["ep"], plans[0]["dims"]["zero"], plans[0]["dims"]["recompute"]) == (2, 3, "full")
    assert plans[0]["all_to_all_bytes_per_step"] > 0


def test_a_moe_plan_that_does_not_fit_names_ep_as_the_smallest_change(capsys):
    assert main(["plan", *QWEN, "cluster.nproc_per_node=8", "hardware.memory_gib=61.5", "parallel.zero=3",
                 "recompute=full"]) == 1
    line = capsys.readouterr().out.splitlines()[-1]
    assert line.startswith("does not fit (63.12 GiB per rank > 61.5 GiB); the smallest change that fits: "
                           "parallel.ep=4 (61.43 GiB per rank, est. ")
