"""scripts/bench_ep_cpu.py's bookkeeping: the timed exchange's seconds and bytes, and the table from per-rank
records and metrics rows (no process group: the all-to-all and the clock are stand-ins)."""

from __future__ import annotations

import pytest
import torch
from helpers.bench_scripts import fake_clock, load

bench = load("bench_ep_cpu")


def test_timed_exchange_counts_forward_and_backward_seconds_and_bytes_sent():
    calls = []

    def send(t, output_splits, input_splits):  # rows as many as the output splits say, each = rows received
        calls.append((tuple(t.shape), output_splits, input_splits))
        return t.new_full((sum(output_splits), t.shape[1]), float(len(t)))

    clock = fake_clock(bench.ExchangeClock, [10.0, 10.5, 20.0, 20.25])
    timed = bench.timed_all_to_all_function()
    x = torch.zeros(6, 4, requires_grad=True)  # 16 bytes a row
    clock.begin(7)
    out = timed.apply(x, [2, 3], [2, 4], send, 0, clock)
    out.sum().backward()
    clock.end()
    clock.add("pairs", 99.0, 99)  # outside a step: not counted
    assert out.shape == (5, 4) and out[0, 0].item() == 6.0
    assert calls == [((6, 4), [2, 3], [2, 4]), ((5, 4), [2, 4], [2, 3])]  # backward: the splits swapped
    assert x.grad.shape == (6, 4) and x.grad.unique().tolist() == [5.0]
    # forward sends 4 rows to rank 1, backward 3: (4 + 3) x 16 bytes
    assert clock.steps == [{"step": 7, "pairs_s": 0.75, "counts_s": 0.0, "pairs": 2, "counts": 0, "bytes_sent": 112}]


def test_bytes_to_others_leaves_out_this_ranks_own_split():
    assert bench.bytes_to_others([3, 5, 7], 1, 8) == 80
    assert bench.bytes_to_others([0, 0], 0, 512) == 0


def rank(r: int, steps: list[tuple[float, float, int]]) -> dict:
    return {"rank": r, "steps": [{"step": i + 1, "pairs_s": p, "counts_s": c, "pairs": 24, "counts": 6,
                                  "bytes_sent": b} for i, (p, c, b) in enumerate(steps)]}


ROWS = [{"step": 1, "step_time_s": 9.0}, {"step": 2, "step_time_s": 0.5}, {"step": 2, "val_loss": 1.0},
        {"step": 3, "step_time_s": 0.25}]


def test_summarize_skips_warm_up_and_takes_mean_and_slowest_rank():
    ranks = [rank(1, [(5.0, 5.0, 0), (0.25, 0.0, 2048), (0.25, 0.0, 2048)]),
             rank(0, [(5.0, 5.0, 0), (0.125, 0.0625, 1024), (0.0625, 0.0, 2048)])]
    got = bench.summarize(ranks, ROWS, steps=3, skip=1)
    # step 0.375 s; rank 0 (0.1875 + 0.0625) / 2 = 0.125 s, rank 1 0.25 s
    assert got == {"step_ms": 375.0, "all_to_all_ms": 187.5, "all_to_all_max_ms": 250.0, "counts_ms": 15.625,
                   "share": 0.5, "sent_kib": 1.75, "pairs": 24.0, "counts": 6.0}


def test_summarize_names_what_is_missing():
    with pytest.raises(ValueError, match=r"^metrics.jsonl has no step_time_s for steps \[4\]"):
        bench.summarize([rank(0, [(0.0, 0.0, 0)] * 4)], ROWS, steps=4, skip=1)
    with pytest.raises(ValueError, match=r"^rank 0's timing lacks steps of 2\.\.3$"):
        bench.summarize([rank(0, [(0.0, 0.0, 0)] * 2)], ROWS, steps=3, skip=1)


def test_table_gives_median_and_range_over_repeats():
    run = {"step_ms": 100.0, "all_to_all_ms": 20.0, "all_to_all_max_ms": 25.0, "counts_ms": 5.0, "share": 0.2,
           "sent_kib": 3072.0}
    slower = dict(run, step_ms=140.0, share=0.25)
    assert bench.harness.cell([3.0, 1.0, 2.0], "{:.1f}") == "2.0 [1.0-3.0]"
    assert bench.harness.cell([3.0, 3.0], "{:.1f}") == "3.0"
    assert bench.table({"2 procs, ep2": [run, slower, run]}) == [
        "| layout | step ms | all-to-all ms (mean) | (max rank) | of which counts | share of step | sent KiB/rank |",
        "|---|---:|---:|---:|---:|---:|---:|",
        "| 2 procs, ep2 | 100.0 [100.0-140.0] | 20.0 | 25.0 | 5.0 | 20.0% [20.0%-25.0%] | 3,072 |"]
