"""`llmtrain tune [OVERRIDES...] [--top K] [--steps S] [--budget-min M] [--no-refine] [--launch]`: the plan's K
fastest layouts that fit, each trained S steps as a trial on the configured backend (TUNE_DIR/<layout>; TUNE_DIR is
run.dir when given, else runs/<run.name>-tune); then the measured-fastest layout again with train.compile and with
optim.fused switched, one at a time (refine.py; `--no-refine` skips this round); one table of estimate against
measurement, the measured fastest of all written as TUNE_DIR/best/parallel/tuned.yaml with the command that
launches it, and the layout trials fitted into the plan's step time (plan/calibration.py). The same command again
reuses every recorded trial and launches none."""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import dataclass, field

from llmtrain.rundir.atomic import atomic_write_json
from llmtrain.config.errors import ConfigError
from llmtrain.errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK
from llmtrain.console import get_console, say
from llmtrain.launch.backends.traits import traits_of
from llmtrain.sweep import record
from llmtrain.sweep.plan import SweepPlan
from llmtrain.tune import candidates, noise, refine, table, trials, winner
from llmtrain.tune.calibration import learn, uncalibrated_parts

SELECTION_FILE = "tune.json"


def add_tune_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--top", type=int, default=4, metavar="K", help="layouts to measure (default 4)")
    parser.add_argument("--steps", type=int, default=20, metavar="S",
                        help="training steps per trial (default 20); the first 3 (1 below 8 steps) are warm-up")
    parser.add_argument("--budget-min", type=float, default=None, metavar="M",
                        help="start no trial that would end past M minutes (estimated from the trials so far)")
    parser.add_argument("--no-refine", action="store_true",
                        help="skip the second round (the fastest layout measured again with train.compile and "
                             "with optim.fused switched, one at a time)")
    parser.add_argument("--launch", action="store_true", help="then launch the real run with the fastest layout")


def run_tune(cfg, args) -> int:
    if args.top < 1:
        raise ConfigError("--top", f"must be at least 1 (got {args.top})")
    if args.steps < 2:
        raise ConfigError("--steps", f"must be at least 2: the first step is warm-up (got {args.steps})")
    if args.budget_min is not None and args.budget_min <= 0:
        raise ConfigError("--budget-min", f"must be positive (got {args.budget_min:g})")
    tune_dir = _tune_dir(cfg, args.overrides)
    chosen = _selection(cfg, args, tune_dir)
    if not chosen:
        n = cfg.cluster.nnodes * cfg.cluster.nproc_per_node
        raise ConfigError("hardware.memory_gib", f"no layout of {n} devices fits the device memory; try more "
                                                 "devices, a smaller train.micro_batch_size or model.seq_len")
    runs = [trials.sweep_run(tune_dir, i, r, list(args.overrides), args.steps) for i, r in enumerate(chosen)]
    _follow_queued(runs)
    earlier = record.read(tune_dir) or {}
    plan = SweepPlan(tune_dir, list(args.overrides), list(args.config_dir), runs, earlier.get("runs", []))
    record.write(plan)
    hw = chosen[0].plan.hardware
    say(f"tune {plan.name}: {len(chosen)} layout(s) of {cfg.model.name} on {cfg.cluster.nnodes}x"
        f"{cfg.cluster.nproc_per_node} {hw['name']} device(s), {args.steps} steps each, in {tune_dir}")
    budget = Budget(args.budget_min)
    done, stop_code, not_started = _run_trials(plan, chosen, args, budget)
    if stop_code is None and not not_started and not args.no_refine:  # refine the fastest of all the layouts
        more, stop_code, left = _refine(plan, chosen, done, args, budget, hw["name"])
        done, not_started = done + more, not_started + left
    return _finish(cfg, args, tune_dir, done, stop_code, not_started, hw["name"])


def _follow_queued(runs) -> None:
    for run in runs:
        if traits_of(run.cfg.cluster.name).queued:
            run.cfg.cluster.follow = True  # a trial is measured after it ends, one at a time


@dataclass
class Budget:
    """--budget-min over both rounds: the time since the first trial and the walls of the trials launched."""
    minutes: float | None
    start: float = field(default_factory=time.monotonic)
    walls: list[float] = field(default_factory=list)

    def next_ends_past(self) -> float | None:
        """The mean trial's seconds, when one more trial would end past the budget; else None."""
        if self.minutes is None or not self.walls:
            return None
        mean = sum(self.walls) / len(self.walls)
        spent = max(time.monotonic() - self.start, sum(self.walls))
        return mean if spent + mean > self.minutes * 60 else None


def _tune_dir(cfg, overrides) -> str:
    given = any(o.split("=", 1)[0].lstrip("+~") == "run.dir" for o in overrides)
    return os.path.abspath(cfg.run.dir if given else f"{cfg.run.dir}-tune")


def _selection(cfg, args, tune_dir: str) -> list[candidates.Ranked]:
    """The plan's top K; the layouts an earlier run of the same command chose, when there is one (its measurements
    have moved the estimates since, which must not change the trials)."""
    ranking = candidates.ranked(cfg)
    key = {"overrides": list(args.overrides), "config_dirs": list(args.config_dir), "top": args.top,
           "steps": args.steps}
    path = os.path.join(tune_dir, SELECTION_FILE)
    try:
        with open(path) as f:
            saved = json.load(f)
    except (OSError, ValueError):
        saved = {}
    by_name = {r.layout.name: r for r in ranking}
    if {k: saved.get(k) for k in key} == key and all(name in by_name for name in saved.get("layouts", [])):
        return [by_name[name] for name in saved["layouts"]]
    chosen = candidates.top(ranking, args.top)
    if not chosen:
        return chosen  # refused by the caller, with nothing written
    os.makedirs(tune_dir, exist_ok=True)
    atomic_write_json(path, {**key, "layouts": [r.layout.name for r in chosen]}, indent=1)
    return chosen


def _run_trials(plan: SweepPlan, chosen, args, budget: Budget,
                first: int = 0) -> tuple[list[trials.Trial], int | None, int]:
    """Run `chosen` as plan.runs[first:]; (the trials recorded or run, the code that stopped the tune early, trials
    left unstarted by the budget)."""
    done: list[trials.Trial] = []
    for number, (run, ranked) in enumerate(zip(plan.runs[first:], chosen), first + 1):
        recorded = trials.read_result(plan.dir, ranked.layout.name, ranked.layout.overrides)
        if recorded is not None:
            say(f"tune: reusing trial {recorded.layout}: {table.fit_cell(recorded)} (recorded in "
                f"{trials.result_path(plan.dir, recorded.layout)})")
            done.append(recorded)
            continue
        mean = budget.next_ends_past()
        if mean is not None:
            left = first + len(chosen) - number + 1
            say(f"tune: budget of {budget.minutes:g} min: not starting {left} trial(s) (each takes ~{mean:.0f} s)")
            return done, None, left
        trial = trials.new_trial(ranked, uncalibrated_parts(ranked.layout.cfg))
        try:
            trial, code = trials.run_trial(plan, run, number, trial, ranked, args.steps)
        except KeyboardInterrupt:  # between trials, or before this trial's job started
            return done, EXIT_INTERRUPTED, 0
        if code is not None:  # stopped (Ctrl-C, preemption): this trial measured nothing worth keeping
            return done, code, 0
        trials.write_result(plan.dir, trial)
        done.append(trial)
        if trial.wall_s:
            budget.walls.append(trial.wall_s)
        if trial.fit != trials.OK:
            say(f"tune: trial {trial.layout}: {table.fit_cell(trial)}; going on with the next one")
    return done, None, 0


def _refine(plan: SweepPlan, chosen, done, args, budget: Budget,
            profile: str) -> tuple[list[trials.Trial], int | None, int]:
    """The second round (refine.py) on the measured-fastest layout, as more runs of the tune's sweep."""
    best = table.fastest(done)
    if best is None:
        return [], None, 0
    base = next(r for r in chosen if r.layout.name == best.layout)
    found, skipped = refine.variants(base, refine.device_type(profile))
    for line in skipped:
        say(f"tune: {line}")
    if not found:
        return [], None, 0
    first = len(plan.runs)
    runs = [trials.sweep_run(plan.dir, first + i, r, list(args.overrides), args.steps) for i, r in enumerate(found)]
    _follow_queued(runs)
    plan.runs.extend(runs)
    record.write(plan)
    say(f"tune: refining {best.layout}: {', '.join(r.layout.name for r in found)}")
    return _run_trials(plan, found, args, budget, first)


def _finish(cfg, args, tune_dir: str, done, stop_code, not_started: int, profile: str) -> int:
    console = get_console()
    best = noise.winner(done)  # a refinement only when it is faster beyond both trials' spreads
    title = (f"tune {os.path.basename(tune_dir)}: {cfg.model.name}, global batch {cfg.train.global_batch_size}, "
             f"{args.steps} steps per trial (median tokens/s after the first {trials.warmup_steps(args.steps)})")
    if done:
        table.render(done, title, console, cfg.precision.compute_dtype)
    calibration = learn(cfg, profile, done)
    if calibration is not None:
        say(f"tune: the plan is now {calibration.line()} (efficiency {calibration.efficiency:.1%}, comm factor "
            f"{calibration.comm_factor:.2f})")
    if stop_code is not None:
        say("tune: stopped; the same command goes on from the recorded trials")
        return stop_code
    if best is None:
        say("tune: no trial was measured; nothing to launch")
        return EXIT_FAILED
    line = winner.launch_line(tune_dir, list(args.config_dir), list(args.overrides))
    path = winner.write(tune_dir, refine.tuned_overrides(cfg, best.overrides), cfg.train.global_batch_size, line,
                        f"{best.layout}, {best.tokens_per_s:,.0f} tokens/s measured")
    say(f"tune: fastest measured: {best.layout} ({best.tokens_per_s:,.0f} tokens/s"
        + (f", MFU {best.shown_mfu:.2%}" if best.shown_mfu is not None else "") + f"); written to {path}")
    say(f"tune: launch it with: {line}")
    if not_started:
        say(f"tune: {not_started} trial(s) not measured (budget); the same command measures them")
    if args.launch:
        return _launch_winner(tune_dir, args, line)
    return EXIT_OK


def _launch_winner(tune_dir: str, args, line: str) -> int:
    """The real run, recorded (job.json) as the launch line it is, so `llmtrain status` shows how to rerun it."""
    import shlex
    import sys

    from llmtrain.launch.config_probes import compose_here, validate_here
    from llmtrain.launch.run import launch

    origins: dict[str, str] = {}
    cfg = compose_here(winner.launch_overrides(list(args.overrides)),
                       [*args.config_dir, winner.best_dir(tune_dir)], origins)
    validate_here(cfg)
    saved = sys.argv
    sys.argv = [saved[0] if saved else "llmtrain", *shlex.split(line)[1:]]
    try:
        return launch(cfg, origins)
    finally:
        sys.argv = saved
