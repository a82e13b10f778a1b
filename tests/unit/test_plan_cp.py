"""Context parallel in `llmtrain plan`: what a rank keeps (against the bytes autograd saves, the gather simulated in
one process), state over dp x cp, the k/v gathers' traffic, the layout line, and `--suggest`'s search over cp,
micro-batch and recompute."""

from __future__ import annotations

import json

import pytest
import torch
from helpers.sweep_tables import table_rows
from helpers.head_loss import trained_loss

from llmtrain.cli import main
from llmtrain.config import compose_config
from llmtrain.model import build_model, init_parameters
from llmtrain.parallel import context_parallel as cp_model
from llmtrain.parallel.recompute import apply_recompute
from llmtrain.plan.cli import plan_for, plan_hardware
from llmtrain.plan.context_parallel import local_config
from llmtrain.plan.estimate import loss_bytes
from llmtrain.plan.search import Layout, Search
from llmtrain.train.memory import SavedActivations

TINY = ["model=llama-tiny", "model.n_layers=2", "model.d_model=256", "model.n_heads=4", "model.seq_len=512",
        "hardware=cpu", "+hardware.peak_tflops.float32=0.05", "data=synthetic"]
LLAMA_8K = ["model=llama3-8b", "precision=bf16", "hardware=h100", "model.seq_len=8192"]


@pytest.fixture(autouse=True)
def uncalibrated(monkeypatch, tmp_path):
    monkeypatch.setenv("COLUMNS", "250")
    monkeypatch.setenv("LLMTRAIN_CACHE", str(tmp_path / "cache"))


class _Mesh:
    """What ContextParallelCore asks of its mesh: one rank of a cp group."""

    def __init__(self, cp: int, rank: int):
        self.cp, self.rank = cp, rank

    def get_group(self):
        return None

    def size(self) -> int:
        return self.cp

    def get_local_rank(self) -> int:
        return self.rank


@pytest.mark.parametrize("cp,rank", [(2, 1), (4, 2)])
@pytest.mark.parametrize("mode", ["none", "selective", "full"])
def test_saved_activations_of_a_cp_rank_match_the_plan(monkeypatch, cp, rank, mode):
    """One rank's forward with the all-gather simulated (the other ranks' keys and values random): the bytes autograd
    saves, parameters excluded, against the plan's activations (blocks and loss) within 2%."""
    def gather(t, group):
        return torch.cat([t if r == rank else torch.randn_like(t) for r in range(cp)])

    monkeypatch.setattr(cp_model, "gather_sequence", gather)
    b = 4
    cfg = compose_config([*TINY, f"cluster.nproc_per_node={cp}", f"parallel.cp={cp}", f"recompute={mode}",
                          f"train.micro_batch_size={b}", "parallel.dp=1"])
    m = cfg.model
    model = build_model(m)
    init_parameters(model, 0, 0.02, m.n_layers)
    cp_model.apply_context_parallel(model, _Mesh(cp, rank), m.seq_len)
    cp_model.set_token_positions(model, _Mesh(cp, rank), m.seq_len, torch.device("cpu"))
    if mode != "none":
        apply_recompute(model, mode, 1)
    x = torch.randint(0, m.vocab_size, (b, m.seq_len))[:, cp_model.rank_positions(m.seq_len, cp, rank)]
    with SavedActivations(list(model.parameters())) as saved:
        trained_loss(model, cfg, x, x)
    planned = plan_for(cfg).stages[0].activation_bytes
    assert abs(planned / saved.total - 1) <= 0.02, (planned, saved.total)


def test_activations_divide_by_cp_but_for_the_gathered_keys_and_values():
    """llama-tiny's block at seq 512, micro 4 (sbh = 2 MiB fp32): 20 sbh at cp=1 (the plan's CPU terms); at cp=2 half
    of it, the whole keys and values (4 x 512 x 128 x 2 x 4 bytes = 2 MiB) instead of the local half, the attention
    output once more (1 MiB) and two causal masks (5 chunk lengths of 128 x 128 fp32: 0.3125 MiB)."""
    def layer(cp: int, mode: str = "none") -> float:
        cfg = compose_config([*TINY, f"cluster.nproc_per_node={cp}", f"parallel.cp={cp}", "train.micro_batch_size=4",
                              f"recompute={mode}"])
        plan = plan_for(cfg)
        return (plan.stages[0].activation_bytes - loss_bytes(local_config(cfg), 4)) / 2 / 2**20

    rope = 2 * 512 * 64 * 4 / 2**20
    assert layer(1) == pytest.approx(20 * 2 + rope)
    assert layer(2) == pytest.approx((20 * 2 + rope) / 2 - 1 + 2 + 1 + 0.3125)
    assert layer(2, "selective") == pytest.approx((20 * 2 + rope) / 2)  # the core's gather is redone in backward
    assert layer(2, "full") == pytest.approx(1.0)  # the block input of 256 tokens


def test_state_shards_over_dp_x_cp_and_the_gathers_are_counted():
    cfg = compose_config([*LLAMA_8K, "cluster.nproc_per_node=8", "parallel.cp=2", "parallel.zero=3",
                          "train.micro_batch_size=1", "train.global_batch_size=8"])
    plan = plan_for(cfg)
    params = plan.stages[0].params_per_rank
    assert plan.stages[0].state_bytes["optimizer"] == pytest.approx(params * 8 / 8)  # dp 4 x cp 2
    assert plan.dims["cp"] == 2 and plan.dims["dp"] == 4
    # 32 layers x 2 micro-batches x (forward gather + backward reduce-scatter) x 1/2 of 2 x 8192 x 1024 x 2 bytes
    assert plan.comm_bytes_per_step["cp"] == 32 * 2 * 2 * 0.5 * 2 * 8192 * 1024 * 2
    one = plan_for(compose_config([*LLAMA_8K, "cluster.nproc_per_node=8", "parallel.zero=3",
                                   "train.micro_batch_size=1", "train.global_batch_size=8"]))
    assert "cp" not in one.comm_bytes_per_step and plan.peak_bytes_per_rank < 0.7 * one.peak_bytes_per_rank


def test_the_layout_line_and_json_show_cp(capsys):
    assert main(["plan", *TINY, "cluster.nproc_per_node=2", "parallel.cp=2"]) == 0
    rows = dict(r[:2] for r in table_rows(capsys.readouterr().out) if len(r) >= 2)
    assert rows["layout"] == "dp=1 (shard 1) cp=2 tp=1 pp=1 x v1 ep=1 zero=0 schedule=1f1b recompute=none"
    assert main(["plan", *TINY, "cluster.nproc_per_node=2", "parallel.cp=2", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["dims"]["cp"] == 2 and plan["comm_bytes_per_step"]["cp"] > 0


def test_suggest_without_numbers_plans_the_configs_devices_and_one_number_is_an_error(capsys):
    assert main(["plan", *LLAMA_8K, "cluster.nnodes=4", "cluster.nproc_per_node=8", "--suggest"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "layouts that fit 32 devices of 80 GiB (global batch 32), fastest first"
    assert main(["plan", *LLAMA_8K, "--suggest", "32"]) == 2
    assert capsys.readouterr().err.strip() == ("llmtrain: error: --suggest: takes no numbers (the config's devices and "
                                               "the hardware profile's memory) or two, N_GPUS GIB (got 1)")


def _search(overrides: list[str], n: int, gib: float) -> Search:
    cfg = compose_config(overrides)
    speed, hw = plan_hardware(cfg)
    return Search(cfg, n, min(8, n), speed * 1e12, gib * 2**30, hw)


def test_llama3_8b_at_8k_on_32_gpus_of_80_gib_fits_without_full_recompute():
    """The top suggestion fits, without recompute=full (layouts without it fit: the table's first is one), and it
    is the fastest of every layout that fits."""
    search = _search(LLAMA_8K, 32, 80)
    plans, fitting = search.suggested(15)
    top = plans[0]
    assert top.fits and top.dims["recompute"] != "full" and fitting >= len(plans) == 15
    assert top.tokens_per_s == max(p.tokens_per_s for p in search.fitting())


def test_the_pruned_search_finds_what_planning_every_layout_finds():
    """llama3-8b cut to 4 layers on 4 GPUs of 12 GiB (full recompute needed for some layouts, none for others):
    every layout planned without pruning, and the fastest that fits is the search's first."""
    overrides = [*LLAMA_8K, "model.n_layers=4", "train.global_batch_size=8"]
    search = _search(overrides, 4, 20)
    best = None
    for tp, pp, cp, ep, micros in search.groups():
        for zero in (0, 2, 3):
            for recompute in ("none", "selective", "full"):
                for micro in micros:
                    layout = Layout(tp, pp, cp, ep, zero, recompute, micro)
                    if not search.layout_valid(layout):
                        continue
                    plan = search.plan(layout)
                    if plan.fits and (best is None or plan.tokens_per_s > best.tokens_per_s):
                        best = plan
    plans, _ = search.suggested(5)
    assert best is not None and plans[0].tokens_per_s == pytest.approx(best.tokens_per_s)
    assert {p.dims["recompute"] for p in search.fitting()} == {"none", "selective", "full"}


def test_suggest_says_why_the_first_wins(capsys):
    assert main(["plan", *LLAMA_8K, "--suggest", "32", "80"]) == 0
    lines = capsys.readouterr().out.splitlines()
    why = next(line for line in lines if line.startswith("why first: "))
    assert why.startswith("why first: the fastest est. tokens/s of ")
    assert "; the runner-up (" in why and why.endswith("more exposed communication a step")
