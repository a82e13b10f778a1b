"""Running a timed-collective benchmark through llmtrain's real trainer on CPU + gloo: what
scripts/bench_ep_cpu.py and scripts/bench_cp_cpu.py share.

A benchmark script prepares each run's directory as `llmtrain launch` does (`Bench.prepare`), starts torchrun on
its own worker entry (`Bench.run`: `SCRIPT --worker RUN_DIR [--untimed]`), and there, before
`llmtrain.worker.main`, swaps a collective for a timed one that adds to a `StepClock`; `Bench.worker` marks the
optimizer steps on Trainer.train_step and writes RUN_DIR/<timing file> per rank at exit. The parent reads the
metrics rows and those records back, keeps the steps after the warm-up (`timed_steps`) and prints a markdown table
of the median over repeats [min-max] (`table`, `cell`).

Importing this module puts this checkout's llmtrain first on sys.path (also under torchrun) and imports no torch.
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
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # this checkout's llmtrain, also under torchrun (which runs the bench as a script)


# ---------------------------------------------------------------------------------------------------- bookkeeping

class StepClock:
    """One rank's seconds, counts and bytes per optimizer step for each kind of exchange; what happens outside a
    step (none in training: evaluation is off) is not counted. A step's record: {"step", "<kind>_s", "<kind>"
    for each kind, and `bytes_key`}."""

    def __init__(self, kinds: tuple[str, ...], bytes_key: str, now=time.perf_counter):
        self.kinds, self.bytes_key, self.now = kinds, bytes_key, now
        self.steps: list[dict] = []
        self._step: dict | None = None

    def begin(self, step: int) -> None:
        self._step = {"step": step, self.bytes_key: 0}
        for kind in self.kinds:
            self._step.update({f"{kind}_s": 0.0, kind: 0})

    def end(self) -> None:
        if self._step is not None:
            self.steps.append(self._step)
        self._step = None

    def add(self, kind: str, seconds: float, nbytes: int = 0) -> None:
        """One exchange of `kind`: its seconds, and the bytes it moved between this rank and the others."""
        if self._step is not None:
            self._step[f"{kind}_s"] += seconds
            self._step[kind] += 1
            self._step[self.bytes_key] += nbytes


def mean(values: Iterable[float]) -> float:
    values = list(values)
    return sum(values) / len(values)


def timed_steps(ranks: list[dict], rows: list[dict], steps: int, skip: int,
                fields: tuple[str, ...] = ("step_time_s",)) -> tuple[dict[str, list[float]], list[list[dict]]]:
    """Steps skip+1..steps of one run: {field: its values at those steps} from the metrics rows (every field
    needed at every one of them), and every rank's step records over them, ranks in order. Raises ValueError
    naming what is missing."""
    timed = list(range(skip + 1, steps + 1))
    metrics = {field: {r["step"]: r[field] for r in rows if field in r} for field in fields}
    missing = [s for s in timed if any(s not in metrics[field] for field in fields)]
    if missing:
        raise ValueError(f"metrics.jsonl has no {' or '.join(fields)} for steps {missing} (train.log_interval=1 "
                         "gives every step)")
    per_rank = []
    for record in sorted(ranks, key=lambda r: r["rank"]):
        by_step = {s["step"]: s for s in record["steps"]}
        if any(s not in by_step for s in timed):
            raise ValueError(f"rank {record['rank']}'s timing lacks steps of {timed[0]}..{timed[-1]}")
        per_rank.append([by_step[s] for s in timed])
    return {field: [metrics[field][s] for s in timed] for field in fields}, per_rank


# ---------------------------------------------------------------------------------------------------- the table

def cell(values: list[float], fmt: str) -> str:
    """The median, and the range when there are several runs."""
    text = fmt.format(statistics.median(values))
    if len(values) > 1 and min(values) != max(values):
        text += f" [{fmt.format(min(values))}-{fmt.format(max(values))}]"
    return text


def table(results: dict[str, list[dict]], columns: list[tuple[str, str, str]]) -> list[str]:
    """Markdown rows: a layout per row, each figure (columns: key, heading, format) the median over its runs
    [min-max]."""
    lines = ["| layout | " + " | ".join(name for _, name, _ in columns) + " |",
             "|---|" + "---:|" * len(columns)]
    for layout, runs in results.items():
        lines.append(f"| {layout} | " + " | ".join(cell([r[key] for r in runs], fmt) for key, _, fmt in columns) + " |")
    return lines


# ---------------------------------------------------------------------------------------------------- the command line

def add_run_arguments(p: argparse.ArgumentParser, *, repeats: int, steps: int, skip: int, batch: int,
                      micro: int) -> None:
    """--repeats --steps --skip --batch --micro, with the bench's defaults."""
    p.add_argument("--repeats", type=int, default=repeats)
    p.add_argument("--steps", type=int, default=steps)
    p.add_argument("--skip", type=int, default=skip, help="warm-up steps left out")
    p.add_argument("--batch", type=int, default=batch, help="train.global_batch_size")
    p.add_argument("--micro", type=int, default=micro, help="train.micro_batch_size")


def add_control_and_worker_arguments(p: argparse.ArgumentParser, control_help: str) -> None:
    """--control, the hidden worker entry (--worker RUN_DIR, --untimed) and the llmtrain overrides."""
    p.add_argument("--control", action="store_true", help=control_help)
    p.add_argument("--worker", metavar="RUN_DIR", help=argparse.SUPPRESS)
    p.add_argument("--untimed", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("overrides", nargs="*", help="llmtrain key=value overrides")


def parse_args(p: argparse.ArgumentParser, worker: Callable[..., int]) -> argparse.Namespace:
    """The arguments; on the worker entry (--worker RUN_DIR) this process is a torchrun worker: it runs
    worker(RUN_DIR, timed_exchanges=not --untimed) and exits with its code."""
    a = p.parse_args()
    if a.worker:
        sys.exit(worker(a.worker, timed_exchanges=not a.untimed))
    if not 1 <= a.skip < a.steps:
        p.error("need 1 <= --skip < --steps")
    return a


def fixed_overrides(a, procs: int) -> list[str]:
    """The overrides every run of a bench ends with: its batch and steps, every step logged, no evaluation or
    checkpoint, `procs` processes of fp32 CPU with one thread each."""
    return [f"train.micro_batch_size={a.micro}", f"train.global_batch_size={a.batch}", f"train.max_steps={a.steps}",
            "train.log_interval=1", "train.eval_interval=0", "checkpoint.at_end=false", "checkpoint.resume=none",
            f"cluster.nproc_per_node={procs}", "device=cpu", "precision=fp32", "launch.omp_num_threads=1"]


# ---------------------------------------------------------------------------------------------------- the runs

@dataclass(frozen=True)
class Bench:
    """One benchmark script: `prog` names it in error lines, `script` is the file torchrun runs (its __file__),
    `timing_file` the per-rank record ("..._rank{rank}.json"), `tmp_prefix` its temporary run directories';
    `show_stdout`: a failed run's message also has the tail of torchrun's stdout."""

    prog: str
    script: str
    timing_file: str
    tmp_prefix: str
    show_stdout: bool = False

    def prepare(self, overrides: list[str]):
        """The run directory (run.dir in overrides) as `llmtrain launch` leaves it for the workers; bad overrides
        fail here, one line, with their exit code."""
        from rich.console import Console

        from llmtrain.errors import LlmtrainError
        from llmtrain.launch.config_probes import compose_here, validate_here
        from llmtrain.launch.run import check_resume, prepare_data, prepare_run_dir

        try:
            origins: dict[str, str] = {}
            cfg = compose_here(overrides, origins=origins)
            validate_here(cfg)
            prepare_data(cfg)
            check_resume(cfg, Console(quiet=True), origins)
            prepare_run_dir(cfg)
        except LlmtrainError as e:  # bad input: one line, and its exit code (2)
            print(f"{self.prog}: {e}", file=sys.stderr)
            sys.exit(e.exit_code)
        return cfg

    def check(self, overrides: Callable[[str], list[str]]) -> None:
        """Prepare a throwaway run directory: a config's errors show before the first run starts."""
        with tempfile.TemporaryDirectory(prefix=self.tmp_prefix) as tmp:
            self.prepare(overrides(os.path.join(tmp, "run")))

    def run(self, overrides: Callable[[str], list[str]], procs: int, timed: bool, what: str) -> tuple[list, list]:
        """One run of `procs` processes (overrides(run_dir) its config): the metrics rows and every rank's timing
        record. A failed run exits naming `what` (e.g. "ep=2"), with the tails of its output and rank logs."""
        with tempfile.TemporaryDirectory(prefix=self.tmp_prefix) as tmp:
            run_dir = os.path.join(tmp, "run")
            self.prepare(overrides(run_dir))
            argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={procs}",
                    self.script, "--worker", run_dir, *([] if timed else ["--untimed"])]
            proc = subprocess.run(argv, env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True)
            if proc.returncode:
                logs = "".join(f"--- rank {r}\n" + Path(run_dir, "logs", f"rank{r}.log").read_text(errors="replace")
                               [-2000:] for r in range(procs) if Path(run_dir, "logs", f"rank{r}.log").exists())
                stdout = f"{proc.stdout[-2000:]}\n" if self.show_stdout else ""
                sys.exit(f"the {what} run on {procs} processes failed ({proc.returncode}):\n{stdout}"
                         f"{proc.stderr[-3000:]}\n{logs}")
            rows = [json.loads(line) for line in Path(run_dir, "metrics.jsonl").read_text().splitlines()
                    if line.strip()]
            ranks = [json.loads(Path(run_dir, self.timing_file.format(rank=r)).read_text()) for r in range(procs)]
        return rows, ranks

    def worker(self, run_dir: str, clock: StepClock, swap: Callable[[], None] | None) -> int:
        """The torchrun worker: `swap()` puts the timed collective in place (None: the plain one stays), then
        llmtrain's worker trains with every optimizer step marked on `clock`; the rank's steps go to its timing
        file."""
        from llmtrain import worker as llmtrain_worker
        from llmtrain.train.trainer import Trainer

        train_step = Trainer.train_step

        def marked_train_step(self):
            clock.begin(self.step + 1)
            try:
                return train_step(self)
            finally:
                clock.end()

        if swap is not None:
            swap()
        Trainer.train_step = marked_train_step
        code = llmtrain_worker.main([run_dir])
        rank = int(os.environ["RANK"])
        Path(run_dir, self.timing_file.format(rank=rank)).write_text(json.dumps({"rank": rank, "steps": clock.steps}))
        return code
