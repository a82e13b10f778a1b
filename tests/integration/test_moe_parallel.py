"""A mixture-of-experts model (moe-tiny: layer 0 dense, layers 1-3 sparse, 8 experts, top 2, a shared expert)
trains the same under every layout as in one process (fp32, CPU + gloo), auxiliary losses and router bias
balancing included.

Each layout runs 10 steps and must match one process's loss, gradient norm, val_loss, aux_loss and router_z_loss to
1e-5, and route the same tokens to the same experts (expert_tokens summed over data-parallel ranks, gathered per
global layer over pipeline stages; the router bias, moved after every step from those sums, steers the choice).
Expert parallel (ep2, ep4, with ZeRO-2/3, pipeline, tensor parallel) exchanges the pairs by all-to-all and must
match too. Recompute rides along on three layouts; a checkpoint saved under dp2 resumes under tp2, one saved
under ep2 resumes under ep4 and in one process; torch.compile's first steps equal eager's. A router forced onto
one expert shows the collapse in metrics.jsonl and on the console.
"""

from __future__ import annotations

import json

import pytest
import torch
from conftest import SMALL
from helpers.inprocess_run import train_in_process as train
from helpers.parity import TOL, assert_parity, by_step

from llmtrain.config import compose_config
from llmtrain.launch.config_probes import validate_here
from llmtrain.model.moe import moe_modules

pytestmark = pytest.mark.slow
MOE = SMALL + ["model=moe-tiny", "train.max_steps=10", "train.global_batch_size=8", "train.micro_batch_size=2",
               "train.eval_interval=5", "train.eval_steps=1", "model.moe.bias_update_rate=0.001"]
N_EXPERTS, SPARSE = 8, [1, 2, 3]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    rows = train(tmp_path_factory.mktemp("moe-ref") / "run", *MOE, "cluster.nproc_per_node=1")
    return by_step(rows)


def assert_moe_parity(rows, reference, label, steps=range(1, 11)):
    """assert_parity, plus the router's losses to 1e-5 and the same tokens per expert in every sparse layer."""
    assert_parity(rows, reference, label, steps)
    got = by_step(rows)
    for key in ("aux_loss", "router_z_loss"):
        diff = max(abs(got[s][key] - reference[s][key]) for s in steps)
        assert diff <= TOL, f"{label}: max |{key} diff| {diff:.2e} > {TOL}"
    for s in steps:
        assert got[s]["moe_layers"] == SPARSE, label
        assert got[s]["expert_tokens"] == reference[s]["expert_tokens"], f"{label}: step {s} expert_tokens"


def test_reference_reports_the_routing(reference):
    """One process's rows: the MoE fields on every logged step, their numbers consistent with each other."""
    # 8 samples x 64 tokens, each routed to 2 experts, per sparse layer and step.
    for s, row in reference.items():
        assert row["moe_layers"] == SPARSE
        assert [sum(t) for t in row["expert_tokens"]] == [8 * 64 * 2] * 3, s
        assert row["experts_idle"] == [t.count(0) for t in row["expert_tokens"]]
        assert row["expert_load"] == [max(t) * N_EXPERTS / sum(t) for t in row["expert_tokens"]]
        assert 1.0 <= min(row["expert_load"]) and max(row["expert_load"]) <= N_EXPERTS
        assert row["aux_loss"] > 0 and row["router_z_loss"] > 0


LAYOUTS = {
    # name: (processes, overrides)
    "dp2_zero3": (2, ["parallel.zero=3", "checkpoint.interval=5"]),
    "tp2_sp_selective_recompute": (2, ["parallel.tp=2", "parallel.sequence_parallel=true", "recompute=selective"]),
    "pp2_1f1b_full_recompute": (2, ["parallel.pp=2", "parallel.pp_schedule=1f1b", "recompute=full"]),
    "dp2_tp2_zero3": (4, ["parallel.tp=2", "parallel.zero=3"]),
    # Several stages per rank: each stage's auxiliary loss counts once, the shape-inference forward not at all.
    "pp2_v2_interleaved_1f1b": (2, ["parallel.pp=2", "parallel.pp_schedule=interleaved_1f1b",
                                    "parallel.virtual_stages=2"]),
    "pp2_v2_zbv": (2, ["parallel.pp=2", "parallel.pp_schedule=zbv", "parallel.virtual_stages=2"]),
    "pp2_gpipe": (2, ["parallel.pp=2", "parallel.pp_schedule=gpipe"]),
    "pp2_v2_looped_bfs": (2, ["parallel.pp=2", "parallel.pp_schedule=looped_bfs", "parallel.virtual_stages=2"]),
    "pp2_v2_zero_bubble": (2, ["parallel.pp=2", "parallel.pp_schedule=zero_bubble", "parallel.virtual_stages=2"]),
    "pp2_v2_dualpipe_v": (2, ["parallel.pp=2", "parallel.pp_schedule=dualpipe_v", "parallel.virtual_stages=2"]),
    # Expert parallel: the experts split over ep data-parallel ranks, the pairs exchanged by all-to-all.
    "ep2": (2, ["parallel.ep=2"]),
    "ep4_zero2": (4, ["parallel.ep=4", "parallel.zero=2"]),
    "ep2_dp2_zero3": (4, ["parallel.ep=2", "parallel.zero=3", "checkpoint.interval=5"]),
    "ep2_pp2_full_recompute": (4, ["parallel.ep=2", "parallel.pp=2", "recompute=full"]),
    "ep2_tp2_sp": (4, ["parallel.ep=2", "parallel.tp=2", "parallel.sequence_parallel=true"]),
}
SAVED = {"dp2_zero3", "ep2_dp2_zero3"}  # runs whose step-5 checkpoints later tests resume


@pytest.fixture(scope="module")
def saved_runs(tmp_path_factory):
    """The layouts that save a checkpoint at step 5, run once each on first use: {name: (run dir, rows)}."""
    runs = {}

    def get(name):
        if name not in runs:
            run_dir = tmp_path_factory.mktemp(f"moe-{name}") / "run"
            nproc, overrides = LAYOUTS[name]
            runs[name] = run_dir, train(run_dir, *MOE, f"cluster.nproc_per_node={nproc}", *overrides)
        return runs[name]
    return get


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_layout_matches_one_process(name, reference, saved_runs, tmp_path):
    if name in SAVED:
        rows = saved_runs(name)[1]
    else:
        nproc, overrides = LAYOUTS[name]
        rows = train(tmp_path / name, *MOE, f"cluster.nproc_per_node={nproc}", *overrides)
    assert_moe_parity(rows, reference, name)
    ep = next((int(o.split("=")[1]) for o in LAYOUTS[name][1] if o.startswith("parallel.ep=")), 1)
    for row in by_step(rows).values():
        # Each ep rank's received pairs are its experts' tokens; none of it logged without expert parallel.
        local = N_EXPERTS // ep
        expected = [[sum(t[j * local:(j + 1) * local]) for j in range(ep)] for t in row["expert_tokens"]]
        assert row.get("ep_tokens") == (expected if ep > 1 else None), name


@pytest.mark.parametrize("saved_as, nproc, overrides", [
    ("dp2_zero3", 2, ["parallel.tp=2", "parallel.sequence_parallel=true"]),
    # Expert parallel's checkpoint holds every expert whole: any other ep (or none) reads it.
    ("ep2_dp2_zero3", 4, ["parallel.ep=4"]),
    ("ep2_dp2_zero3", 1, []),
])
def test_checkpoint_resumes_under_another_layout(saved_as, nproc, overrides, reference, saved_runs, tmp_path):
    """A step-5 checkpoint resumed under another layout in another run directory: steps 6..10 continue the
    one-process losses and routing."""
    saved = saved_runs(saved_as)[0] / "checkpoints" / "step-0000005"
    rows = train(tmp_path / "resumed", *MOE, f"cluster.nproc_per_node={nproc}", *overrides,
                 f"checkpoint.resume={saved}")
    assert_moe_parity(rows, reference, f"moe {saved_as} -> {nproc} ranks {overrides} from step 5",
                      steps=range(6, 11))


def test_context_parallel_sums_the_balancing_loss_over_the_sequence(reference, tmp_path):
    """cp2: each rank holds half of every sequence; the balancing loss's token shares and mean probabilities are
    summed over both, so loss, aux_loss and routing equal one process's. Five steps: after them, with bias
    balancing on, a router score within rounding of a tie may pick the other expert (the attention over gathered
    keys rounds differently), and the bias then moves another way."""
    rows = train(tmp_path / "cp2", *MOE, "cluster.nproc_per_node=2", "parallel.cp=2", "train.stop_at_step=5")
    assert_moe_parity(rows, reference, "moe cp2", steps=range(1, 6))


def test_compiled_steps_match_eager(reference, tmp_path):
    """train.compile=true in one process: each block compiled, the sparse blocks' per-expert loop left eager
    (its slices' sizes change every step). Its first 3 steps equal eager's to 1e-5 (over 10 steps the
    fused kernels' rounding, fed back through the routing, drifts past that)."""
    got = by_step(train(tmp_path / "compiled", *MOE, "cluster.nproc_per_node=1", "train.compile=true",
                        "train.stop_at_step=3"))
    assert sorted(got) == [1, 2, 3]
    for s in got:
        for key in ("loss", "aux_loss", "router_z_loss"):
            assert abs(got[s][key] - reference[s][key]) <= TOL, (s, key)
        assert abs(got[s]["grad_norm"] - reference[s]["grad_norm"]) <= TOL * reference[s]["grad_norm"], s
        assert got[s]["expert_tokens"] == reference[s]["expert_tokens"], s


def one_process(run_dir, *overrides: str):
    """A trainer of moe-tiny on synthetic data in this process (the one_rank fixture's group)."""
    from llmtrain.train.trainer import Trainer

    cfg = compose_config([*SMALL, "model=moe-tiny", "data=synthetic", "train.global_batch_size=4",
                          "train.micro_batch_size=2", f"run.dir={run_dir}", "cluster.nproc_per_node=1", *overrides])
    validate_here(cfg)
    run_dir.mkdir(exist_ok=True)
    return Trainer(cfg, str(run_dir), torch.device("cpu"))


def rows_of(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_a_router_forced_onto_one_expert_shows_the_collapse(tmp_path, one_rank, capsys):
    """Top 1, expert 3's router bias far above any score: every token of every sparse layer goes to expert 3, so
    expert_load is n_experts and the other 7 are idle; bias balancing lowers expert 3's bias and raises the
    others' by the rate after each step."""
    trainer = one_process(tmp_path / "forced", "model.moe.top_k=1", "train.max_steps=2",
                          "model.moe.bias_update_rate=0.25")
    blocks = moe_modules(trainer.model.parts[0])
    for m in blocks:
        m.router_bias[3] = 100.0
    trainer.train()
    rows = rows_of(tmp_path / "forced")
    tokens = 4 * 64  # the step's samples x tokens, each to one expert
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["moe_layers"] == SPARSE
        assert r["expert_tokens"] == [[0, 0, 0, tokens, 0, 0, 0, 0]] * 3
        assert r["expert_load"] == [8.0] * 3 and r["experts_idle"] == [7] * 3
    assert capsys.readouterr().out.count("| expert_load 8.00 |") == 2
    for m in blocks:
        assert m.router_bias.tolist() == [0.5, 0.5, 0.5, 99.5, 0.5, 0.5, 0.5, 0.5]


def test_fp8_keeps_routers_and_experts_in_bf16(tmp_path, one_rank, monkeypatch, capsys):
    """precision=fp8 (torchao's float8 layers run on CPU; the trainer is shown an H100): the attention matrices,
    the dense layer's MLP and the shared experts become float8, the routers and routed experts do not, and the
    set-up line says so."""
    pytest.importorskip("torchao")
    from helpers.fp8_cases import H100

    from llmtrain.hardware import profiles as hardware

    monkeypatch.setattr(hardware, "device_name", lambda device_type=None: H100)
    monkeypatch.setattr(hardware, "device_capability", lambda: "9.0")
    monkeypatch.setattr(hardware, "device_memory_gib", lambda: 80.0)
    one_process(tmp_path / "fp8", "precision=fp8", "train.max_steps=2").train()
    # Per layer q, k, v, proj (16), layer 0's MLP (3), the 3 sparse layers' shared experts (9).
    assert ("llmtrain: precision=fp8: 28 linear layers in float8 (recipe tensorwise), embedding, head, MoE routers "
            "and routed experts in bf16 (torchao's grouped float8 is not used)") in capsys.readouterr().out
    rows = rows_of(tmp_path / "fp8")
    assert [r["step"] for r in rows] == [1, 2] and all(r["loss"] > 0 and r["aux_loss"] > 0 for r in rows)
