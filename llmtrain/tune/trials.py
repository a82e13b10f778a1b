"""One trial: a layout trained for a few steps as a run of the tune's sweep (TUNE_DIR/<layout>, listed in
TUNE_DIR/sweep.yaml, so `llmtrain compare TUNE_DIR` reads them too), launched by the sweep's own code on the
configured backend, then measured from its metrics.jsonl. Each result is written atomically to
TUNE_DIR/trials/<layout>.json as soon as the trial ends; a re-run of the tune reads it instead of launching."""

from __future__ import annotations

import json
import os
import statistics
import time
from dataclasses import asdict, dataclass

from llmtrain.rundir.atomic import atomic_write_json
from llmtrain.rundir.metrics_file import read_metrics
from llmtrain.rundir.mfu_field import PEAK_KEY, shown_mfu
from llmtrain.rundir.paths import RunPaths
from llmtrain.sweep import SWEEP_NAME_VAR
from llmtrain.sweep.expand import Combination
from llmtrain.sweep.plan import SweepPlan, SweepRun
from llmtrain.tune.candidates import Ranked, memory_short

OK, OUT_OF_MEMORY, FAILED = "ok", "out of memory", "failed"
MEMORY_REFUSALS = ("launch.max_memory_ratio", "launch.require_fit")


@dataclass
class Trial:
    layout: str
    overrides: list[str]  # the layout's keys
    estimated_tokens_per_s: float
    estimated_mfu: float | None  # None: no known peak (a CPU's, unless given)
    estimated_peak_gib: float
    compute_s: float  # the plan's step time parts at 100% efficiency and comm_factor 1 (calibration's inputs)
    comm_s: float
    fit: str = OK  # ok | out of memory | failed
    reason: str = ""
    tokens_per_s: float | None = None  # median over the steps after the warm-up
    tokens_per_s_q1: float | None = None  # its quartiles: the spread (noise.py); None in a trial recorded before
    tokens_per_s_q3: float | None = None
    mfu: float | None = None  # median of the rows' MFU, when they have one to show
    mfu_peak_tflops: float | None = None  # the peak it is against; None in a trial recorded before it was kept
    peak_gib: float | None = None
    measured_steps: int = 0
    wall_s: float = 0.0  # the trial's launch, start-up included
    run_dir: str = ""
    refines: str = ""  # a refinement trial (refine.py): the layout it switched train.compile or optim.fused of

    @property
    def measured(self) -> bool:
        return self.fit == OK and self.tokens_per_s is not None

    @property
    def shown_mfu(self) -> float | None:
        """The MFU to show: measured against a recorded peak, at most 100% (rundir/mfu_field.py)."""
        if not self.measured or self.mfu_peak_tflops is None:
            return None
        return shown_mfu({"mfu": self.mfu, PEAK_KEY: self.mfu_peak_tflops})


def warmup_steps(steps: int) -> int:
    """The first steps left out of the measurement (start-up, allocator and cache warm-up)."""
    return 3 if steps >= 8 else 1


def trial_keys(steps: int) -> dict:
    """What makes a run a trial: S steps, every step logged, no evaluation, no checkpoint."""
    return {"train.max_steps": steps, "train.log_interval": 1, "train.eval_interval": 0, "checkpoint.at_end": False,
            "checkpoint.interval": 0, "checkpoint.interval_minutes": 0}


def result_path(tune_dir: str, layout: str) -> str:
    return os.path.join(tune_dir, "trials", f"{layout}.json")


def read_result(tune_dir: str, layout: str, overrides: list[str]) -> Trial | None:
    """The recorded trial of this layout, when it was run with these overrides."""
    try:
        with open(result_path(tune_dir, layout)) as f:
            data = json.load(f)
        trial = Trial(**data)
    except (OSError, ValueError, TypeError):
        return None
    return trial if trial.overrides == overrides else None


def write_result(tune_dir: str, trial: Trial) -> None:
    path = result_path(tune_dir, trial.layout)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    atomic_write_json(path, asdict(trial), indent=1)


def new_trial(ranked: Ranked, raw_plan) -> Trial:
    """A trial before it runs: the estimate it is compared with (`ranked`, as the tune ranked it) and the plan's
    uncalibrated parts (`raw_plan`: efficiency 1, comm_factor 1) that calibration fits."""
    p = ranked.plan
    return Trial(ranked.layout.name, ranked.layout.overrides, p.tokens_per_s, p.mfu, p.peak_bytes_per_rank / 2**30,
                 raw_plan.compute_s, raw_plan.exposed_comm_s, refines=ranked.layout.refines)


def sweep_run(tune_dir: str, index: int, ranked: Ranked, user_overrides: list[str], steps: int) -> SweepRun:
    """The trial as a run of the tune's sweep: the layout's config with the trial's keys and its folder."""
    layout = ranked.layout
    keys = trial_keys(steps)
    cfg = layout.cfg.copy()
    for key, value in keys.items():
        section, name = key.split(".")
        cfg[section][name] = value
    extra = [f"{key}={str(value).lower()}" for key, value in keys.items()]
    cfg.run.dir = os.path.join(tune_dir, layout.name)
    cfg.env[SWEEP_NAME_VAR] = os.path.basename(tune_dir)
    combination = Combination(index, {k: v.split("=", 1)[1] for k, v in zip(layout.values, layout.overrides)},
                              tuple(user_overrides + layout.overrides + extra))
    return SweepRun(combination, cfg)


def run_trial(plan: SweepPlan, run: SweepRun, number: int, trial: Trial, ranked: Ranked,
              steps: int) -> tuple[Trial, int | None]:
    """Launch the trial (or record why it cannot fit) and measure it; (the trial, the exit code that stops the
    tune: Ctrl-C or preemption, else None). KeyboardInterrupt before the job starts is left to the caller."""
    from llmtrain.sweep.launch_sweep import FAILED as RUN_FAILED
    from llmtrain.sweep.launch_sweep import STOPPED, run_one

    trial.run_dir = run.dir
    short = memory_short(ranked.plan, run.cfg)
    if short:
        trial.fit, trial.reason = OUT_OF_MEMORY, short
        return trial, None
    start = time.monotonic()
    outcome = run_one(plan, run, number)
    trial.wall_s = time.monotonic() - start
    if outcome.state == STOPPED:
        return trial, outcome.code
    if outcome.state == RUN_FAILED:
        trial.fit, trial.reason = classify_failure(run.dir, outcome.detail)
        return trial, None
    measure(trial, run.dir, steps)
    return trial, None


def classify_failure(run_dir: str, detail: str) -> tuple[str, str]:
    """(out of memory | failed, why) from the launch's refusal or the first failed rank's error."""
    if detail.startswith("refused: ") and detail.split(": ", 1)[1] in MEMORY_REFUSALS:
        return OUT_OF_MEMORY, detail
    reason = detail
    if os.path.isdir(run_dir) and not detail.startswith("refused"):
        from llmtrain.jobs.job_state import job_state

        reason = job_state(run_dir).reason or detail
    low = reason.lower()
    if "out of memory" in low or "outofmemory" in low:
        return OUT_OF_MEMORY, reason
    return FAILED, reason


def measure(trial: Trial, run_dir: str, steps: int) -> None:
    """Medians of the logged steps after the warm-up, and the quartiles of their tokens/s; failed when there are
    none."""
    rows = [r for r in read_metrics(RunPaths(run_dir).metrics) if r.get("tokens_per_s") is not None]
    steady = [r for r in rows if r.get("step", 0) > warmup_steps(steps)]
    if not steady:
        trial.fit, trial.reason = FAILED, f"no step after the first {warmup_steps(steps)} was logged"
        return
    speeds = [r["tokens_per_s"] for r in steady]
    trial.tokens_per_s = statistics.median(speeds)
    trial.tokens_per_s_q1, _, trial.tokens_per_s_q3 = (
        statistics.quantiles(speeds, n=4, method="inclusive") if len(speeds) > 1 else speeds * 3)
    shown = [(shown_mfu(r), r.get(PEAK_KEY)) for r in steady]
    mfus = [mfu for mfu, _ in shown if mfu is not None]
    trial.mfu = statistics.median(mfus) if mfus else None
    trial.mfu_peak_tflops = next((peak for mfu, peak in shown if mfu is not None), None)
    mems = [r["mem_gib"] for r in rows if r.get("mem_gib") is not None]
    trial.peak_gib = max(mems) if mems else None
    trial.measured_steps = len(steady)
