"""Expert parallel's all-to-all time per step against the step time, through llmtrain's trainer on CPU + gloo.

For each size P in --ep (default 2,4) two runs of P processes train the same model on the same samples (fp32,
OMP_NUM_THREADS=1, parallel.zero=0 by default): `parallel.ep=P` (each rank holds 1/P of every sparse layer's routed
experts) and the dense data-parallel reference `parallel.ep=1` (every rank holds every expert), so the step-time
cost of expert parallel shows next to the exchanges' own time.

Each run is torchrun on this script's own worker entry (--worker RUN_DIR; the run directory prepared as
`llmtrain launch` prepares it). Before calling `llmtrain.worker.main` it replaces the two exchanges expert
parallel uses, `llmtrain.parallel.expert_parallel.group_all_to_all` and `.exchange_counts`, with timed ones:
  pairs:  an autograd Function whose forward is the all-to-all of the routed pairs (to the experts' ranks, and
          their outputs back) and whose backward is the reverse all-to-all of the gradient (split sizes
          swapped), each timed around funcol.all_to_all_single + wait_tensor;
  counts: the all-to-all of the per-expert token counts that comes first in every sparse block.
The timer starts before the rank enters the collective and stops when it has the result, so it includes waiting
for the slowest peer to arrive (routing, expert compute and scheduling skew between ranks): the mean over ranks
and the slowest rank are both shown. Each rank keeps its seconds, exchanges and bytes sent to other ranks per
optimizer step (Trainer.train_step marks the steps) and writes RUN_DIR/ep_timing_rank{R}.json at exit.

Per run, over steps skip+1..steps: step = mean step_time_s of RUN_DIR/metrics.jsonl (rank 0's train step,
train.log_interval=1); all-to-all = the mean per step of pairs + counts seconds, averaged over ranks (mean) and
the largest rank's (max); share = mean all-to-all / step; sent = bytes a rank sends to other ranks per step
(pairs, forward and backward; at a balanced router (P-1)/P of its pairs leave the rank each time). The table
gives the median over --repeats and the range [min-max]. --control adds a run of each ep layout with the plain
exchanges (steps still marked, nothing timed): its step time against the timed run's is what the timers cost.

  python scripts/bench_ep_cpu.py [--ep 2,4] [--repeats 3] [--steps 30] [--skip 5] [--batch 8] [--micro 2]
                                 [--zero 0] [--control] [OVERRIDES...]
  OVERRIDES (llmtrain's key=value, after the defaults model=moe-tiny and data=stdlib), e.g. model.seq_len=64
"""

from __future__ import annotations

import argparse
import sys
import time
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared harness, also when this file is loaded by path

import bench_exchange_harness as harness  # noqa: E402  (puts this checkout's llmtrain first on sys.path)

BENCH = harness.Bench(prog="bench_ep_cpu", script=__file__, timing_file="ep_timing_rank{rank}.json",
                      tmp_prefix="bench-ep-")
KINDS = ("pairs", "counts")  # the routed pairs' all-to-all (forward and backward), the token counts' one


# ---------------------------------------------------------------------------------------------------- bookkeeping

class ExchangeClock(harness.StepClock):
    """One rank's exchange seconds, counts and bytes sent per optimizer step (kinds "pairs" and "counts")."""

    def __init__(self, now=time.perf_counter):
        super().__init__(KINDS, "bytes_sent", now)


def bytes_to_others(rows: list[int], me: int, row_bytes: int) -> int:
    """Bytes an all-to-all sends off this rank: every split but its own."""
    return (sum(rows) - rows[me]) * row_bytes


def timed_all_to_all_function():
    """The pairs' exchange as an autograd Function (built on call: importing this script imports no torch):
    apply(x, output_splits, input_splits, send, me, clock), `send(t, output_splits, input_splits)` the plain
    all-to-all, `me` this rank's index in the group."""
    import torch

    class TimedAllToAll(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, output_splits, input_splits, send, me, clock):
            ctx.splits, ctx.send, ctx.me, ctx.clock = (output_splits, input_splits), send, me, clock
            x = x.contiguous()
            start = clock.now()
            out = send(x, output_splits, input_splits)
            row = x[0].numel() * x.element_size() if len(x) else 0
            clock.add("pairs", clock.now() - start, bytes_to_others(input_splits, me, row))
            return out

        @staticmethod
        def backward(ctx, grad):
            output_splits, input_splits = ctx.splits
            grad = grad.contiguous()
            start = ctx.clock.now()
            back = ctx.send(grad, input_splits, output_splits)
            row = grad[0].numel() * grad.element_size() if len(grad) else 0
            ctx.clock.add("pairs", ctx.clock.now() - start, bytes_to_others(output_splits, ctx.me, row))
            return back, None, None, None, None, None

    return TimedAllToAll


# ---------------------------------------------------------------------------------------------------- the worker

def worker(run_dir: str, timed_exchanges: bool) -> int:
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol

    import llmtrain.parallel.expert_parallel as expert_parallel

    clock = ExchangeClock()
    timed = timed_all_to_all_function()
    plain_counts = expert_parallel.exchange_counts

    def group_all_to_all(group):
        def send(t, output_splits, input_splits):
            return funcol.wait_tensor(funcol.all_to_all_single(t, output_splits, input_splits, group))

        def exchange(x, output_splits, input_splits):
            return timed.apply(x, output_splits, input_splits, send, dist.get_rank(group), clock)
        return exchange

    def exchange_counts(counts, group):
        start = clock.now()
        received = plain_counts(counts, group)
        clock.add("counts", clock.now() - start)
        return received

    def swap():
        expert_parallel.group_all_to_all = group_all_to_all
        expert_parallel.exchange_counts = exchange_counts

    return BENCH.worker(run_dir, clock, swap if timed_exchanges else None)


# ---------------------------------------------------------------------------------------------------- the table

def summarize(ranks: list[dict], rows: list[dict], steps: int, skip: int) -> dict:
    """One run's figures over steps skip+1..steps from every rank's timing record and the metrics rows."""
    metrics, timed = harness.timed_steps(ranks, rows, steps, skip)
    mean = harness.mean
    per_rank = [{"all_to_all_s": mean(s["pairs_s"] + s["counts_s"] for s in mine),
                 "counts_s": mean(s["counts_s"] for s in mine), "bytes_sent": mean(s["bytes_sent"] for s in mine),
                 "pairs": mean(s["pairs"] for s in mine), "counts": mean(s["counts"] for s in mine)} for mine in timed]
    step_s = mean(metrics["step_time_s"])
    mean_s = mean(r["all_to_all_s"] for r in per_rank)
    return {"step_ms": 1e3 * step_s, "all_to_all_ms": 1e3 * mean_s,
            "all_to_all_max_ms": 1e3 * max(r["all_to_all_s"] for r in per_rank),
            "counts_ms": 1e3 * mean(r["counts_s"] for r in per_rank), "share": mean_s / step_s,
            "sent_kib": mean(r["bytes_sent"] for r in per_rank) / 1024,
            "pairs": mean(r["pairs"] for r in per_rank), "counts": mean(r["counts"] for r in per_rank)}


COLUMNS = [("step_ms", "step ms", "{:.1f}"), ("all_to_all_ms", "all-to-all ms (mean)", "{:.1f}"),
           ("all_to_all_max_ms", "(max rank)", "{:.1f}"), ("counts_ms", "of which counts", "{:.1f}"),
           ("share", "share of step", "{:.1%}"), ("sent_kib", "sent KiB/rank", "{:,.0f}")]


def table(results: dict[str, list[dict]]) -> list[str]:
    """Markdown rows: a layout per row, each figure the median over its runs [min-max]."""
    return harness.table(results, COLUMNS)


# ---------------------------------------------------------------------------------------------------- one run

def overrides(a, procs: int, ep: int, run_dir: str) -> list[str]:
    model = [] if any(o.startswith("model=") for o in a.overrides) else ["model=moe-tiny"]
    return [f"run.dir={run_dir}", *model, "data=stdlib", *a.overrides, f"parallel.ep={ep}",
            f"parallel.zero={a.zero}", *harness.fixed_overrides(a, procs)]


def run(a, procs: int, ep: int, timed: bool = True) -> dict:
    rows, ranks = BENCH.run(partial(overrides, a, procs, ep), procs, timed, f"ep={ep}")
    return summarize(ranks, rows, a.steps, a.skip)


def sizes(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers") from None
    if any(v < 2 for v in values):
        raise argparse.ArgumentTypeError("every size must be at least 2 (its ep=1 reference runs anyway)")
    return values


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ep", type=sizes, default=[2, 4], metavar="P[,P...]",
                   help="expert parallel sizes (default 2,4); each runs on that many processes, with its ep=1 "
                        "reference")
    harness.add_run_arguments(p, repeats=3, steps=30, skip=5, batch=8, micro=2)
    p.add_argument("--zero", type=int, default=0, choices=[0, 2, 3], help="parallel.zero of every run")
    harness.add_control_and_worker_arguments(
        p, "also run each ep layout with the plain exchanges: its step time shows what the timers cost")
    a = harness.parse_args(p, worker)

    layouts = [(procs, ep, True) for procs in a.ep for ep in (1, procs)]
    layouts += [(procs, procs, False) for procs in a.ep] if a.control else []
    for procs, ep, _ in layouts:  # every config checked before the first run
        BENCH.check(partial(overrides, a, procs, ep))
    print(f"{' '.join(a.overrides) or 'model=moe-tiny'}: global batch {a.batch}, micro-batch {a.micro}, fp32 CPU, "
          f"gloo, OMP_NUM_THREADS=1, parallel.zero={a.zero}; steps {a.skip + 1}..{a.steps} of {a.steps}; "
          f"{a.repeats} repeats", flush=True)
    results: dict[str, list[dict]] = {}
    for i in range(a.repeats):
        for procs, ep, timed in layouts if i % 2 == 0 else layouts[::-1]:
            name = f"{procs} procs, ep{ep}" + (" (dense dp)" if ep == 1 else "" if timed else " untimed")
            r = run(a, procs, ep, timed)
            results.setdefault(name, []).append(r)
            print(f"  repeat {i + 1} {name:<24} step {r['step_ms']:7.1f} ms  all-to-all {r['all_to_all_ms']:6.1f} ms"
                  f" (max rank {r['all_to_all_max_ms']:6.1f}, counts {r['counts_ms']:5.1f}) = {r['share']:6.1%};"
                  f" {r['pairs']:.0f} pair and {r['counts']:.0f} count exchanges, {r['sent_kib']:,.0f} KiB sent"
                  f" per rank per step", flush=True)
    ordered = {name: results[name] for name in sorted(results, key=lambda n: (int(n.split()[0]), n))}
    print("\n" + "\n".join(table(ordered)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
