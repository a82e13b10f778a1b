"""scripts/bench_cp_cpu.py's bookkeeping: the timed all-gather's seconds and bytes forward and backward, and the
table from per-rank records and metrics rows (no process group: the collectives and the clock are stand-ins)."""

from __future__ import annotations

from argparse import Namespace

import pytest
import torch
from helpers.bench_scripts import fake_clock, load

bench = load("bench_cp_cpu")


def test_timed_gather_counts_forward_gather_and_backward_reduce_scatter():
    calls = []

    def gather(x, dim):  # a group of 2 whose other rank holds x + 10
        calls.append(("gather", tuple(x.shape), dim))
        return torch.cat([x, x + 10], dim=dim)

    def scatter(g, dim):  # the other rank's gradient equals this one's: the sum is twice this rank's half
        calls.append(("scatter", tuple(g.shape), dim))
        return 2 * g.narrow(dim, 0, g.shape[dim] // 2)

    clock = fake_clock(bench.CollectiveClock, [1.0, 1.5, 4.0, 4.25])
    timed = bench.timed_all_gather_function()
    x = torch.ones(1, 2, 3, 4, requires_grad=True)  # 24 values, 96 bytes
    clock.begin(5)
    out = timed.apply(x, 2, gather, scatter, 2, clock)
    (out * torch.arange(6.0).view(1, 1, 6, 1)).sum().backward()
    clock.end()
    clock.add("gather", 99.0, 99)  # outside a step: not counted
    assert out.shape == (1, 2, 6, 4) and out[0, 0, :, 0].tolist() == [1.0, 1.0, 1.0, 11.0, 11.0, 11.0]
    assert calls == [("gather", (1, 2, 3, 4), 2), ("scatter", (1, 2, 6, 4), 2)]
    assert x.grad[0, 0, :, 0].tolist() == [0.0, 2.0, 4.0]  # this rank's positions 0-2, summed over 2 ranks
    # forward: 96 bytes received from the other rank; backward: its half of the 192-byte gradient sent to it
    assert clock.steps == [{"step": 5, "bytes": 192, "gather_s": 0.5, "gather": 1, "scatter_s": 0.25, "scatter": 1}]


def test_bytes_from_others_leaves_out_this_ranks_own_share():
    assert bench.bytes_from_others(262144, 2) == 262144
    assert bench.bytes_from_others(1000, 4) == 3000
    assert bench.bytes_from_others(1000, 1) == 0


def rank(r: int, steps: list[tuple[float, float, int]]) -> dict:
    return {"rank": r, "steps": [{"step": i + 1, "gather_s": g, "scatter_s": s, "gather": 16, "scatter": 16,
                                  "bytes": b} for i, (g, s, b) in enumerate(steps)]}


ROWS = [{"step": 1, "loss": 5.5, "step_time_s": 9.0}, {"step": 2, "loss": 5.25, "step_time_s": 0.5},
        {"step": 2, "val_loss": 1.0}, {"step": 3, "loss": 5.0, "step_time_s": 0.25}]


def test_summarize_skips_warm_up_and_takes_mean_and_slowest_rank():
    ranks = [rank(1, [(5.0, 5.0, 0), (0.125, 0.125, 2**20), (0.125, 0.125, 2**20)]),
             rank(0, [(5.0, 5.0, 0), (0.0625, 0.0625, 2**21), (0.0625, 0.0, 2**21)])]
    got = bench.summarize(ranks, ROWS, steps=3, skip=1)
    # step 0.375 s; rank 0: gather 0.0625, scatter 0.03125 s; rank 1: 0.125 and 0.125 s
    assert got == {"step_ms": 375.0, "gather_ms": 93.75, "scatter_ms": 78.125, "comm_ms": 171.875,
                   "comm_max_ms": 250.0, "share": 0.458333333333333333, "mib": 1.5, "gathers": 16.0,
                   "scatters": 16.0, "loss": 5.0}


def test_summarize_needs_the_loss_too():  # the rest of what it checks: the harness's, tested with bench_ep_cpu
    rows = [{k: v for k, v in row.items() if k != "loss" or row["step"] != 3} for row in ROWS]
    with pytest.raises(ValueError, match=r"^metrics.jsonl has no step_time_s or loss for steps \[3\]"):
        bench.summarize([rank(0, [(0.0, 0.0, 0)] * 3)], rows, steps=3, skip=1)


def test_table_gives_median_and_range_over_repeats():
    run = {"step_ms": 100.0, "gather_ms": 8.0, "scatter_ms": 12.0, "comm_ms": 20.0, "comm_max_ms": 25.0,
           "share": 0.2, "mib": 16.0, "loss": 4.785891}
    slower = dict(run, step_ms=140.0, share=0.25)
    assert bench.table({"2 procs, cp2": [run, slower]}) == [
        "| layout | step ms | all-gather ms | reduce-scatter ms | both ms (mean) | (max rank) | share of step | "
        "MiB/rank | loss |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        "| 2 procs, cp2 | 120.0 [100.0-140.0] | 8.0 | 12.0 | 20.0 | 25.0 | 22.5% [20.0%-25.0%] | 16.0 | 4.78589 |"]


def test_layouts_are_cp1_dp_and_cp_on_the_same_global_batch():
    assert bench.layouts(2, control=False) == [("1 proc, cp1", 1, 1, True), ("2 procs, dp2", 2, 1, True),
                                               ("2 procs, cp2", 2, 2, True)]
    assert bench.layouts(4, control=True)[-1] == ("4 procs, cp4 untimed", 4, 4, False)
    a = Namespace(overrides=["model.n_layers=2"], micro=1, batch=2, steps=8)
    got = bench.overrides(a, 2, 2, "/tmp/r")
    assert got[:5] == ["run.dir=/tmp/r", "model=llama-tiny", "model.seq_len=2048", "data=stdlib", "model.n_layers=2"]
    assert {"parallel.cp=2", "train.global_batch_size=2", "cluster.nproc_per_node=2", "parallel.zero=0"} <= set(got)
    mine = bench.overrides(Namespace(**{**vars(a), "overrides": ["model=gpt-tiny", "model.seq_len=256"]}), 1, 1,
                          "/tmp/r")
    assert mine[1:4] == ["data=stdlib", "model=gpt-tiny", "model.seq_len=256"]
