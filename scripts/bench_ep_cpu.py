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
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # this checkout's llmtrain, also under torchrun (which runs this file as a script)

TIMING_FILE = "ep_timing_rank{rank}.json"


# ---------------------------------------------------------------------------------------------------- bookkeeping

class ExchangeClock:
    """One rank's exchange seconds, counts and bytes per optimizer step; what happens outside a step (none in
    training: evaluation is off) is not counted."""

    def __init__(self, now=time.perf_counter):
        self.now = now
        self.steps: list[dict] = []
        self._step: dict | None = None

    def begin(self, step: int) -> None:
        self._step = {"step": step, "pairs_s": 0.0, "counts_s": 0.0, "pairs": 0, "counts": 0, "bytes_sent": 0}

    def end(self) -> None:
        if self._step is not None:
            self.steps.append(self._step)
        self._step = None

    def add(self, kind: str, seconds: float, bytes_sent: int = 0) -> None:
        """kind: "pairs" or "counts"."""
        if self._step is not None:
            self._step[f"{kind}_s"] += seconds
            self._step[kind] += 1
            self._step["bytes_sent"] += bytes_sent


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
    from llmtrain import worker as llmtrain_worker
    from llmtrain.train.trainer import Trainer

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

    train_step = Trainer.train_step

    def marked_train_step(self):
        clock.begin(self.step + 1)
        try:
            return train_step(self)
        finally:
            clock.end()

    if timed_exchanges:
        expert_parallel.group_all_to_all = group_all_to_all
        expert_parallel.exchange_counts = exchange_counts
    Trainer.train_step = marked_train_step
    code = llmtrain_worker.main([run_dir])
    rank = int(os.environ["RANK"])
    Path(run_dir, TIMING_FILE.format(rank=rank)).write_text(json.dumps({"rank": rank, "steps": clock.steps}))
    return code


# ---------------------------------------------------------------------------------------------------- the table

def _mean(values) -> float:
    values = list(values)
    return sum(values) / len(values)


def summarize(ranks: list[dict], rows: list[dict], steps: int, skip: int) -> dict:
    """One run's figures over steps skip+1..steps from every rank's timing record and the metrics rows."""
    timed = list(range(skip + 1, steps + 1))
    step_time = {r["step"]: r["step_time_s"] for r in rows if "step_time_s" in r}
    missing = [s for s in timed if s not in step_time]
    if missing:
        raise ValueError(f"metrics.jsonl has no step_time_s for steps {missing} (train.log_interval=1 gives every step)")
    per_rank = []
    for record in sorted(ranks, key=lambda r: r["rank"]):
        by_step = {s["step"]: s for s in record["steps"]}
        if any(s not in by_step for s in timed):
            raise ValueError(f"rank {record['rank']}'s timing lacks steps of {timed[0]}..{timed[-1]}")
        mine = [by_step[s] for s in timed]
        per_rank.append({"all_to_all_s": _mean(s["pairs_s"] + s["counts_s"] for s in mine),
                         "counts_s": _mean(s["counts_s"] for s in mine),
                         "bytes_sent": _mean(s["bytes_sent"] for s in mine),
                         "pairs": _mean(s["pairs"] for s in mine), "counts": _mean(s["counts"] for s in mine)})
    step_s = _mean(step_time[s] for s in timed)
    mean_s = _mean(r["all_to_all_s"] for r in per_rank)
    return {"step_ms": 1e3 * step_s, "all_to_all_ms": 1e3 * mean_s,
            "all_to_all_max_ms": 1e3 * max(r["all_to_all_s"] for r in per_rank),
            "counts_ms": 1e3 * _mean(r["counts_s"] for r in per_rank), "share": mean_s / step_s,
            "sent_kib": _mean(r["bytes_sent"] for r in per_rank) / 1024,
            "pairs": _mean(r["pairs"] for r in per_rank), "counts": _mean(r["counts"] for r in per_rank)}


COLUMNS = [("step_ms", "step ms", "{:.1f}"), ("all_to_all_ms", "all-to-all ms (mean)", "{:.1f}"),
           ("all_to_all_max_ms", "(max rank)", "{:.1f}"), ("counts_ms", "of which counts", "{:.1f}"),
           ("share", "share of step", "{:.1%}"), ("sent_kib", "sent KiB/rank", "{:,.0f}")]


def cell(values: list[float], fmt: str) -> str:
    """The median, and the range when there are several runs."""
    text = fmt.format(statistics.median(values))
    if len(values) > 1 and min(values) != max(values):
        text += f" [{fmt.format(min(values))}-{fmt.format(max(values))}]"
    return text


def table(results: dict[str, list[dict]]) -> list[str]:
    """Markdown rows: a layout per row, each figure the median over its runs [min-max]."""
    lines = ["| layout | " + " | ".join(name for _, name, _ in COLUMNS) + " |",
             "|---|" + "---:|" * len(COLUMNS)]
    for layout, runs in results.items():
        lines.append(f"| {layout} | " + " | ".join(cell([r[key] for r in runs], fmt) for key, _, fmt in COLUMNS) + " |")
    return lines


# ---------------------------------------------------------------------------------------------------- one run

def overrides(a, procs: int, ep: int, run_dir: str) -> list[str]:
    model = [] if any(o.startswith("model=") for o in a.overrides) else ["model=moe-tiny"]
    return [f"run.dir={run_dir}", *model, "data=stdlib", *a.overrides, f"parallel.ep={ep}",
            f"parallel.zero={a.zero}", f"train.micro_batch_size={a.micro}", f"train.global_batch_size={a.batch}",
            f"train.max_steps={a.steps}", "train.log_interval=1", "train.eval_interval=0", "checkpoint.at_end=false",
            "checkpoint.resume=none", f"cluster.nproc_per_node={procs}", "device=cpu", "precision=fp32",
            "launch.omp_num_threads=1"]


def prepare(a, procs: int, ep: int, run_dir: str):
    """The run directory as `llmtrain launch` leaves it for the workers; bad overrides fail here, one line."""
    from rich.console import Console

    from llmtrain.errors import LlmtrainError
    from llmtrain.launch.config_probes import compose_here, validate_here
    from llmtrain.launch.run import check_resume, prepare_data, prepare_run_dir

    try:
        origins: dict[str, str] = {}
        cfg = compose_here(overrides(a, procs, ep, run_dir), origins=origins)
        validate_here(cfg)
        prepare_data(cfg)
        check_resume(cfg, Console(quiet=True), origins)
        prepare_run_dir(cfg)
    except LlmtrainError as e:  # bad input: one line, and its exit code (2)
        print(f"bench_ep_cpu: {e}", file=sys.stderr)
        sys.exit(e.exit_code)
    return cfg


def run(a, procs: int, ep: int, timed: bool = True) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-ep-") as tmp:
        run_dir = os.path.join(tmp, "run")
        prepare(a, procs, ep, run_dir)
        argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={procs}",
                __file__, "--worker", run_dir, *([] if timed else ["--untimed"])]
        proc = subprocess.run(argv, env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True)
        if proc.returncode:
            logs = "".join(f"--- rank {r}\n" + Path(run_dir, "logs", f"rank{r}.log").read_text(errors="replace")[-2000:]
                           for r in range(procs) if Path(run_dir, "logs", f"rank{r}.log").exists())
            sys.exit(f"the ep={ep} run on {procs} processes failed ({proc.returncode}):\n{proc.stderr[-3000:]}\n{logs}")
        rows = [json.loads(line) for line in Path(run_dir, "metrics.jsonl").read_text().splitlines() if line.strip()]
        ranks = [json.loads(Path(run_dir, TIMING_FILE.format(rank=r)).read_text()) for r in range(procs)]
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
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--skip", type=int, default=5, help="warm-up steps left out")
    p.add_argument("--batch", type=int, default=8, help="train.global_batch_size")
    p.add_argument("--micro", type=int, default=2, help="train.micro_batch_size")
    p.add_argument("--zero", type=int, default=0, choices=[0, 2, 3], help="parallel.zero of every run")
    p.add_argument("--control", action="store_true",
                   help="also run each ep layout with the plain exchanges: its step time shows what the timers cost")
    p.add_argument("--worker", metavar="RUN_DIR", help=argparse.SUPPRESS)
    p.add_argument("--untimed", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("overrides", nargs="*", help="llmtrain key=value overrides")
    a = p.parse_args()
    if a.worker:
        return worker(a.worker, timed_exchanges=not a.untimed)
    if not 1 <= a.skip < a.steps:
        p.error("need 1 <= --skip < --steps")

    layouts = [(procs, ep, True) for procs in a.ep for ep in (1, procs)]
    layouts += [(procs, procs, False) for procs in a.ep] if a.control else []
    for procs, ep, _ in layouts:  # every config checked before the first run
        with tempfile.TemporaryDirectory(prefix="bench-ep-") as tmp:
            prepare(a, procs, ep, os.path.join(tmp, "run"))
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
