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
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # this checkout's llmtrain, also under torchrun (which runs this file as a script)
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling bench script, also when loaded by path

from bench_ep_cpu import cell  # noqa: E402  (the median [min-max] cell of expert parallel's table)

TIMING_FILE = "cp_timing_rank{rank}.json"
KINDS = ("gather", "scatter")  # the forward all-gather, its backward reduce-scatter


# ---------------------------------------------------------------------------------------------------- bookkeeping

class CollectiveClock:
    """One rank's seconds, counts and bytes per optimizer step for each kind of exchange; what happens outside a
    step (none in training: evaluation is off) is not counted."""

    def __init__(self, now=time.perf_counter):
        self.now = now
        self.steps: list[dict] = []
        self._step: dict | None = None

    def begin(self, step: int) -> None:
        self._step = {"step": step, "bytes": 0}
        for kind in KINDS:
            self._step.update({f"{kind}_s": 0.0, kind: 0})

    def end(self) -> None:
        if self._step is not None:
            self.steps.append(self._step)
        self._step = None

    def add(self, kind: str, seconds: float, nbytes: int) -> None:
        """kind: "gather" or "scatter"; nbytes: what crossed between this rank and the others."""
        if self._step is not None:
            self._step[f"{kind}_s"] += seconds
            self._step[kind] += 1
            self._step["bytes"] += nbytes


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
    from llmtrain import worker as llmtrain_worker
    from llmtrain.train.trainer import Trainer

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

    train_step = Trainer.train_step

    def marked_train_step(self):
        clock.begin(self.step + 1)
        try:
            return train_step(self)
        finally:
            clock.end()

    if timed_exchanges:
        context_parallel.gather_sequence = gather_sequence
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
    loss = {r["step"]: r["loss"] for r in rows if "loss" in r}
    missing = [s for s in timed if s not in step_time or s not in loss]
    if missing:
        raise ValueError(f"metrics.jsonl has no step_time_s or loss for steps {missing} (train.log_interval=1 gives "
                         "every step)")
    per_rank = []
    for record in sorted(ranks, key=lambda r: r["rank"]):
        by_step = {s["step"]: s for s in record["steps"]}
        if any(s not in by_step for s in timed):
            raise ValueError(f"rank {record['rank']}'s timing lacks steps of {timed[0]}..{timed[-1]}")
        mine = [by_step[s] for s in timed]
        figures = {f"{kind}_s": _mean(s[f"{kind}_s"] for s in mine) for kind in KINDS}
        figures.update({kind: _mean(s[kind] for s in mine) for kind in KINDS})
        figures["bytes"] = _mean(s["bytes"] for s in mine)
        per_rank.append(figures)
    step_s = _mean(step_time[s] for s in timed)
    both = [r["gather_s"] + r["scatter_s"] for r in per_rank]
    return {"step_ms": 1e3 * step_s, "gather_ms": 1e3 * _mean(r["gather_s"] for r in per_rank),
            "scatter_ms": 1e3 * _mean(r["scatter_s"] for r in per_rank), "comm_ms": 1e3 * _mean(both),
            "comm_max_ms": 1e3 * max(both), "share": _mean(both) / step_s,
            "mib": _mean(r["bytes"] for r in per_rank) / 2**20,
            "gathers": _mean(r["gather"] for r in per_rank), "scatters": _mean(r["scatter"] for r in per_rank),
            "loss": loss[steps]}


COLUMNS = [("step_ms", "step ms", "{:.1f}"), ("gather_ms", "all-gather ms", "{:.1f}"),
           ("scatter_ms", "reduce-scatter ms", "{:.1f}"), ("comm_ms", "both ms (mean)", "{:.1f}"),
           ("comm_max_ms", "(max rank)", "{:.1f}"), ("share", "share of step", "{:.1%}"),
           ("mib", "MiB/rank", "{:,.1f}"), ("loss", "loss", "{:.5f}")]


def table(results: dict[str, list[dict]]) -> list[str]:
    """Markdown rows: a layout per row, each figure the median over its runs [min-max]."""
    lines = ["| layout | " + " | ".join(name for _, name, _ in COLUMNS) + " |",
             "|---|" + "---:|" * len(COLUMNS)]
    for layout, runs in results.items():
        lines.append(f"| {layout} | " + " | ".join(cell([r[key] for r in runs], fmt) for key, _, fmt in COLUMNS) + " |")
    return lines


def layouts(cp: int, control: bool) -> list[tuple[str, int, int, bool]]:
    """(name, processes, parallel.cp, timed) of every run of a repeat, in order."""
    runs = [("1 proc, cp1", 1, 1, True), (f"{cp} procs, dp{cp}", cp, 1, True), (f"{cp} procs, cp{cp}", cp, cp, True)]
    return runs + ([(f"{cp} procs, cp{cp} untimed", cp, cp, False)] if control else [])


# ---------------------------------------------------------------------------------------------------- one run

def overrides(a, procs: int, cp: int, run_dir: str) -> list[str]:
    model = [] if any(o.startswith("model=") for o in a.overrides) else ["model=llama-tiny"]
    seq = [] if any(o.startswith("model.seq_len=") for o in a.overrides) else ["model.seq_len=2048"]
    return [f"run.dir={run_dir}", *model, *seq, "data=stdlib", *a.overrides, f"parallel.cp={cp}", "parallel.zero=0",
            f"train.micro_batch_size={a.micro}", f"train.global_batch_size={a.batch}", f"train.max_steps={a.steps}",
            "train.log_interval=1", "train.eval_interval=0", "checkpoint.at_end=false", "checkpoint.resume=none",
            f"cluster.nproc_per_node={procs}", "device=cpu", "precision=fp32", "launch.omp_num_threads=1"]


def prepare(a, procs: int, cp: int, run_dir: str):
    """The run directory as `llmtrain launch` leaves it for the workers; bad overrides fail here, one line."""
    from rich.console import Console

    from llmtrain.errors import LlmtrainError
    from llmtrain.launch.config_probes import compose_here, validate_here
    from llmtrain.launch.run import check_resume, prepare_data, prepare_run_dir

    try:
        origins: dict[str, str] = {}
        cfg = compose_here(overrides(a, procs, cp, run_dir), origins=origins)
        validate_here(cfg)
        prepare_data(cfg)
        check_resume(cfg, Console(quiet=True), origins)
        prepare_run_dir(cfg)
    except LlmtrainError as e:  # bad input: one line, and its exit code (2)
        print(f"bench_cp_cpu: {e}", file=sys.stderr)
        sys.exit(e.exit_code)
    return cfg


def run(a, procs: int, cp: int, timed: bool = True) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-cp-") as tmp:
        run_dir = os.path.join(tmp, "run")
        prepare(a, procs, cp, run_dir)
        argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={procs}",
                __file__, "--worker", run_dir, *([] if timed else ["--untimed"])]
        proc = subprocess.run(argv, env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True)
        if proc.returncode:
            logs = "".join(f"--- rank {r}\n" + Path(run_dir, "logs", f"rank{r}.log").read_text(errors="replace")[-2000:]
                           for r in range(procs) if Path(run_dir, "logs", f"rank{r}.log").exists())
            sys.exit(f"the cp={cp} run on {procs} processes failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n"
                     f"{proc.stderr[-3000:]}\n{logs}")
        rows = [json.loads(line) for line in Path(run_dir, "metrics.jsonl").read_text().splitlines() if line.strip()]
        ranks = [json.loads(Path(run_dir, TIMING_FILE.format(rank=r)).read_text()) for r in range(procs)]
    return summarize(ranks, rows, a.steps, a.skip)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cp", type=int, default=2, help="context parallel size, and the processes of its dp reference")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--skip", type=int, default=2, help="warm-up steps left out")
    p.add_argument("--batch", type=int, default=2, help="train.global_batch_size")
    p.add_argument("--micro", type=int, default=1, help="train.micro_batch_size")
    p.add_argument("--control", action="store_true",
                   help="also run cp with the plain exchange: its step time shows what the timers cost")
    p.add_argument("--worker", metavar="RUN_DIR", help=argparse.SUPPRESS)
    p.add_argument("--untimed", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("overrides", nargs="*", help="llmtrain key=value overrides")
    a = p.parse_args()
    if a.worker:
        return worker(a.worker, timed_exchanges=not a.untimed)
    if not 1 <= a.skip < a.steps:
        p.error("need 1 <= --skip < --steps")
    if a.cp < 2:
        p.error("--cp must be at least 2 (its cp1 references run anyway)")

    runs = layouts(a.cp, a.control)
    for _, procs, cp, _ in runs:  # every config checked before the first run
        with tempfile.TemporaryDirectory(prefix="bench-cp-") as tmp:
            prepare(a, procs, cp, os.path.join(tmp, "run"))
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
