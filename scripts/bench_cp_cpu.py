"""Context parallel's step time and its key/value exchanges, through llmtrain's trainer on CPU + gloo.

Three runs train the same model on the same samples with the same global batch (fp32, OMP_NUM_THREADS=1,
parallel.zero=0): `parallel.cp=P` on P processes (each rank holds seq_len / P tokens of every sample), one
process (cp1), and data parallel on P processes (dp P, cp1), so context parallel's step time shows next to both
references and next to its exchanges' own time.

Each run is torchrun on this script's own worker entry (--worker RUN_DIR; the run directory prepared as
`llmtrain launch` prepares it). Before calling `llmtrain.worker.main` it replaces
`llmtrain.parallel.context_parallel.gather_sequence` (every layer's all-gather of the keys and values over the cp
group, along dim 0) with a timed autograd Function: its forward is the all-gather (funcol's all_gather and
the wait for its result), its backward the reduce-scatter (sum) of the gradient back to the ranks, the backward
the plain all-gather has. Each is timed from entering the collective to holding its result, so the time includes
waiting for the slowest peer. Each rank keeps its seconds, exchanges and bytes received (all-gather) or sent
(reduce-scatter) from and to the other ranks per optimizer step (Trainer.train_step marks the steps) and writes
RUN_DIR/cp_timing_rank{R}.json at exit.

Per run, over steps skip+1..steps: step = mean step_time_s of RUN_DIR/metrics.jsonl (rank 0's train step,
train.log_interval=1); all-gather and reduce-scatter = their mean seconds per step averaged over ranks; exchanges
= both, averaged over ranks (mean) and the largest rank's (max); share = mean exchanges / step; MiB/rank = bytes a
rank receives (forward) plus sends (backward) per step; loss = the last step's loss (the three layouts train the
same model: their losses agree). The table gives the median over --repeats and the range [min-max]. --control adds
a cp run with the plain exchange (steps still marked, nothing timed): its step time against the timed run's is
what the timers cost.

  python scripts/bench_cp_cpu.py [--cp 2] [--repeats 2] [--steps 8] [--skip 2] [--batch 2] [--micro 1]
                                 [--control] [OVERRIDES...]
  OVERRIDES (llmtrain's key=value, after the defaults model=llama-tiny, model.seq_len=2048 and data=stdlib)
"""

from __future__ import annotations

import argparse
import sys
import time
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared harness, also when this file is loaded by path

import bench_exchange_harness as harness  # noqa: E402  (puts this checkout's llmtrain first on sys.path)

BENCH = harness.Bench(prog="bench_cp_cpu", script=__file__, timing_file="cp_timing_rank{rank}.json",
                      tmp_prefix="bench-cp-", show_stdout=True)
KINDS = ("gather", "scatter")  # the forward all-gather, its backward reduce-scatter


# ---------------------------------------------------------------------------------------------------- bookkeeping

class CollectiveClock(harness.StepClock):
    """One rank's seconds, counts and bytes per optimizer step of the all-gathers ("gather") and their
    reduce-scatters ("scatter")."""

    def __init__(self, now=time.perf_counter):
        super().__init__(KINDS, "bytes", now)


def bytes_from_others(local_bytes: int, group_size: int) -> int:
    """An all-gather's bytes received from the other ranks (and its reduce-scatter's sent to them): every rank's
    share but this rank's own."""
    return (group_size - 1) * local_bytes


def timed_all_gather_function():
    """The gather as an autograd Function (built on call: importing this script imports no torch):
    apply(x, gather_dim, gather, scatter, group_size, clock); `gather(x, dim)` the plain all-gather along dim,
    `scatter(grad, dim)` the plain reduce-scatter (sum) along dim, both returning their finished result."""
    import torch

    class TimedAllGather(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, gather_dim, gather, scatter, group_size, clock):
            ctx.dim, ctx.scatter, ctx.size, ctx.clock = gather_dim, scatter, group_size, clock
            x = x.contiguous()
            start = clock.now()
            out = gather(x, gather_dim)
            clock.add("gather", clock.now() - start, bytes_from_others(x.numel() * x.element_size(), group_size))
            return out

        @staticmethod
        def backward(ctx, grad):
            grad = grad.contiguous()
            start = ctx.clock.now()
            back = ctx.scatter(grad, ctx.dim)
            local = grad.numel() * grad.element_size() // ctx.size
            ctx.clock.add("scatter", ctx.clock.now() - start, bytes_from_others(local, ctx.size))
            return back, None, None, None, None, None

    return TimedAllGather


# ---------------------------------------------------------------------------------------------------- the worker

def worker(run_dir: str, timed_exchanges: bool) -> int:
    import torch.distributed as dist
    from torch.distributed import _functional_collectives as funcol

    import llmtrain.parallel.context_parallel as context_parallel

    clock = CollectiveClock()
    timed = timed_all_gather_function()
    # funcol's current names where this torch has them (the *_tensor ones warn that they are deprecated)
    all_gather = getattr(funcol, "all_gather_single", None) or funcol.all_gather_tensor
    reduce_scatter = getattr(funcol, "reduce_scatter_single", None) or funcol.reduce_scatter_tensor

    def finished(t):
        return t.wait() if isinstance(t, funcol.AsyncCollectiveTensor) else t

    def gather_sequence(t, group):
        def gather(x, dim):
            return finished(all_gather(x, dim, group))

        def scatter(g, dim):
            return finished(reduce_scatter(g, "sum", dim, group))
        return timed.apply(t, 0, gather, scatter, dist.get_world_size(group), clock)

    def swap():
        context_parallel.gather_sequence = gather_sequence

    return BENCH.worker(run_dir, clock, swap if timed_exchanges else None)


# ---------------------------------------------------------------------------------------------------- the table

def summarize(ranks: list[dict], rows: list[dict], steps: int, skip: int) -> dict:
    """One run's figures over steps skip+1..steps from every rank's timing record and the metrics rows."""
    metrics, timed = harness.timed_steps(ranks, rows, steps, skip, fields=("step_time_s", "loss"))
    mean = harness.mean
    per_rank = []
    for mine in timed:
        figures = {f"{kind}_s": mean(s[f"{kind}_s"] for s in mine) for kind in KINDS}
        figures.update({kind: mean(s[kind] for s in mine) for kind in KINDS})
        figures["bytes"] = mean(s["bytes"] for s in mine)
        per_rank.append(figures)
    step_s = mean(metrics["step_time_s"])
    both = [r["gather_s"] + r["scatter_s"] for r in per_rank]
    return {"step_ms": 1e3 * step_s, "gather_ms": 1e3 * mean(r["gather_s"] for r in per_rank),
            "scatter_ms": 1e3 * mean(r["scatter_s"] for r in per_rank), "comm_ms": 1e3 * mean(both),
            "comm_max_ms": 1e3 * max(both), "share": mean(both) / step_s,
            "mib": mean(r["bytes"] for r in per_rank) / 2**20,
            "gathers": mean(r["gather"] for r in per_rank), "scatters": mean(r["scatter"] for r in per_rank),
            "loss": metrics["loss"][-1]}


COLUMNS = [("step_ms", "step ms", "{:.1f}"), ("gather_ms", "all-gather ms", "{:.1f}"),
           ("scatter_ms", "reduce-scatter ms", "{:.1f}"), ("comm_ms", "both ms (mean)", "{:.1f}"),
           ("comm_max_ms", "(max rank)", "{:.1f}"), ("share", "share of step", "{:.1%}"),
           ("mib", "MiB/rank", "{:,.1f}"), ("loss", "loss", "{:.5f}")]


def table(results: dict[str, list[dict]]) -> list[str]:
    """Markdown rows: a layout per row, each figure the median over its runs [min-max]."""
    return harness.table(results, COLUMNS)


def layouts(cp: int, control: bool) -> list[tuple[str, int, int, bool]]:
    """(name, processes, parallel.cp, timed) of every run of a repeat, in order."""
    runs = [("1 proc, cp1", 1, 1, True), (f"{cp} procs, dp{cp}", cp, 1, True), (f"{cp} procs, cp{cp}", cp, cp, True)]
    return runs + ([(f"{cp} procs, cp{cp} untimed", cp, cp, False)] if control else [])


# ---------------------------------------------------------------------------------------------------- one run

def overrides(a, procs: int, cp: int, run_dir: str) -> list[str]:
    model = [] if any(o.startswith("model=") for o in a.overrides) else ["model=llama-tiny"]
    seq = [] if any(o.startswith("model.seq_len=") for o in a.overrides) else ["model.seq_len=2048"]
    return [f"run.dir={run_dir}", *model, *seq, "data=stdlib", *a.overrides, f"parallel.cp={cp}", "parallel.zero=0",
            *harness.fixed_overrides(a, procs)]


def run(a, procs: int, cp: int, timed: bool = True) -> dict:
    rows, ranks = BENCH.run(partial(overrides, a, procs, cp), procs, timed, f"cp={cp}")
    return summarize(ranks, rows, a.steps, a.skip)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cp", type=int, default=2, help="context parallel size, and the processes of its dp reference")
    harness.add_run_arguments(p, repeats=2, steps=8, skip=2, batch=2, micro=1)
    harness.add_control_and_worker_arguments(
        p, "also run cp with the plain exchange: its step time shows what the timers cost")
    a = harness.parse_args(p, worker)
    if a.cp < 2:
        p.error("--cp must be at least 2 (its cp1 references run anyway)")

    runs = layouts(a.cp, a.control)
    for _, procs, cp, _ in runs:  # every config checked before the first run
        BENCH.check(partial(overrides, a, procs, cp))
    model = " ".join(o for o in overrides(a, 1, 1, "") if o.startswith("model"))
    print(f"{model}: global batch {a.batch}, micro-batch "
          f"{a.micro}, fp32 CPU, gloo, OMP_NUM_THREADS=1, parallel.zero=0; steps {a.skip + 1}..{a.steps} of "
          f"{a.steps}; {a.repeats} repeats", flush=True)
    results: dict[str, list[dict]] = {name: [] for name, *_ in runs}
    for i in range(a.repeats):
        for name, procs, cp, timed in runs if i % 2 == 0 else runs[::-1]:
            r = run(a, procs, cp, timed)
            if timed and cp > 1 and not r["gathers"]:  # the trainer no longer gathers through the timed seam
                sys.exit("bench_cp_cpu: the cp run made no timed all-gather: "
                         "llmtrain.parallel.context_parallel.gather_sequence is not the exchange it calls")
            results[name].append(r)
            print(f"  repeat {i + 1} {name:<22} step {r['step_ms']:7.1f} ms  all-gather {r['gather_ms']:6.1f} ms"
                  f"  reduce-scatter {r['scatter_ms']:6.1f} ms (max rank both {r['comm_max_ms']:6.1f}) = "
                  f"{r['share']:6.1%}; {r['gathers']:.0f} + {r['scatters']:.0f} exchanges, {r['mib']:,.1f} MiB "
                  f"per rank per step; loss {r['loss']:.5f}", flush=True)
    print("\n" + "\n".join(table(results)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
