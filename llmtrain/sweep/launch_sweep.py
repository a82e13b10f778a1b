"""`llmtrain launch -m OVERRIDES...`: plan the sweep (every combination validated first), write sweep.yaml, then
launch each run as a normal run. cluster=local and ssh: one after another; a failed run is reported and the
sweep goes on (--fail-fast stops it); Ctrl-C stops the run as usual, then the sweep. cluster=slurm: every run is
submitted at once as its own job. Re-running the same command skips finished runs and resumes the others."""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass

from llmtrain.console import error_line, plain, say
from llmtrain.errors import EXIT_FAILED, EXIT_HANGUP, EXIT_INTERRUPTED, EXIT_OK, EXIT_PREEMPTED, KeyedError
from llmtrain.launch.backends.traits import traits_of
from llmtrain.sweep import SWEEP_NAME_VAR, record
from llmtrain.sweep.plan import SweepPlan, SweepRun, naming_the_run, plan_sweep
from llmtrain.sweep.preview import dry_run
from llmtrain.sweep.resume import skip_reason

FINISHED, SUBMITTED, RUNNING, FAILED, STOPPED = "finished", "submitted", "running", "failed", "stopped"


@dataclass
class Outcome:
    run: SweepRun
    state: str
    detail: str = ""
    skipped: bool = False  # not launched: finished before, or its job still runs
    code: int | None = None  # the launch's exit code when it stopped the sweep (Ctrl-C, preemption)


def run_sweep(args) -> int:
    plan = plan_sweep(args.overrides, args.config_dir)
    if args.dry_run:
        return dry_run(plan)
    _check_ready(plan)
    record.write(plan)
    say(f"sweep {plan.name}: {len(plan.runs)} run(s) in {plan.dir} (combinations in {record.sweep_file(plan.dir)})")
    outcomes, stop_code = _run_all(plan, args.fail_fast)
    return _summary(plan, outcomes, stop_code)


def _check_ready(plan: SweepPlan) -> None:
    """What this node can tell (tools on PATH, devices, a free port) for every run, before anything is written."""
    from llmtrain.launch.backends.registry import get_backend

    for run in plan.runs:
        with naming_the_run(run.name):
            get_backend(run.cfg, run.dir).check_ready()


def _run_all(plan: SweepPlan, fail_fast: bool) -> tuple[list[Outcome], int | None]:
    """Each run's outcome, and the exit code that stopped the sweep early (Ctrl-C, preemption), if one did."""
    from llmtrain.launch.run import PreemptRequest

    outcomes: list[Outcome] = []
    for number, run in enumerate(plan.runs, 1):
        try:
            outcome = run_one(plan, run, number)
        except KeyboardInterrupt:  # between runs, or before this run's job started
            outcome = Outcome(run, STOPPED, code=EXIT_INTERRUPTED)
        except PreemptRequest as e:  # SIGTERM / SIGUSR1, or SIGHUP (a closed terminal)
            outcome = Outcome(run, STOPPED, code=e.exit_code)
        outcomes.append(outcome)
        if outcome.state == STOPPED:
            return outcomes, outcome.code
        if outcome.state == FAILED:
            say(f"sweep: run {run.name} failed ({outcome.detail}); "
                + ("stopping the sweep (--fail-fast)" if fail_fast else "going on with the next run"))
            if fail_fast:
                break
    return outcomes, None


def run_one(plan: SweepPlan, run: SweepRun, number: int) -> Outcome:
    skip = skip_reason(run.cfg)
    if skip:
        state, why = skip
        say(f"sweep: skipping {run.name}: {state} ({why})")
        return Outcome(run, state, why, skipped=True)
    say(f"sweep: run {number}/{len(plan.runs)}: {run.name}")
    try:
        with _recorded_as_single_launch(plan, run):
            from llmtrain.launch.run import launch

            code = launch(run.cfg)
    except KeyedError as e:  # refused at launch (a run dir conflict, sbatch, a damaged checkpoint): this run only
        plain(error_line(f"{e} (in sweep run {run.name})"), err=True)
        return Outcome(run, FAILED, f"refused: {e.key}")
    if code in (EXIT_INTERRUPTED, EXIT_PREEMPTED, EXIT_HANGUP):  # the run took the usual path; the sweep stops here
        return Outcome(run, STOPPED, code=code)
    if code != 0:
        return Outcome(run, FAILED, f"exit {code}")
    return Outcome(run, SUBMITTED if traits_of(plan.backend).queued else FINISHED)


@contextlib.contextmanager
def _recorded_as_single_launch(plan: SweepPlan, run: SweepRun):
    """The run's job.json records the command line's overrides: give it the single launch that is this run, so
    `llmtrain status RUN_DIR` shows how to run it again by itself."""
    from hydra._internal.grammar.utils import escape_special_characters

    config_dirs = [arg for d in plan.config_dirs for arg in ("--config-dir", d)]
    argv = ["launch", *config_dirs, *run.combination.overrides, f"run.dir={escape_special_characters(run.dir)}",
            f"++env.{SWEEP_NAME_VAR}={escape_special_characters(plan.name)}"]
    saved = sys.argv
    sys.argv = [saved[0] if saved else "llmtrain", *argv]
    try:
        yield
    finally:
        sys.argv = saved


def _summary(plan: SweepPlan, outcomes: list[Outcome], stop_code: int | None) -> int:
    """One line of what happened to every run; exit 0 when all finished (cluster=slurm: all were submitted or
    had run before), else non-zero."""
    states = {state: [o for o in outcomes if o.state == state] for state in (FINISHED, SUBMITTED, RUNNING, FAILED)}
    reached = {o.run.name for o in outcomes}
    not_started = [run.name for run in plan.runs if run.name not in reached]
    parts = []
    if states[FINISHED]:
        skipped = sum(o.skipped for o in states[FINISHED])
        before = f" ({skipped} skipped: finished before)" if skipped else ""
        parts.append(f"{len(states[FINISHED])} finished{before}")
    if states[SUBMITTED]:
        parts.append(f"{len(states[SUBMITTED])} submitted")
    if states[RUNNING]:
        parts.append(f"{len(states[RUNNING])} still running: " + ", ".join(o.run.name for o in states[RUNNING]))
    if states[FAILED]:
        parts.append(f"{len(states[FAILED])} failed: " + ", ".join(f"{o.run.name} ({o.detail})"
                                                                   for o in states[FAILED]))
    if not_started:
        parts.append(f"{len(not_started)} not started: {', '.join(not_started)}")
    if stop_code is not None:
        how = "Ctrl-C" if stop_code == EXIT_INTERRUPTED else "preemption"
        parts.append(f"stopped by {how} in {outcomes[-1].run.name}")
    say(f"sweep {plan.name}: {len(plan.runs)} run(s): " + "; ".join(parts))
    queued = traits_of(plan.backend).queued  # a submitted run goes on after the sweep's command returns
    done = len(states[FINISHED]) + (len(states[SUBMITTED]) + len(states[RUNNING]) if queued else 0)
    if stop_code is not None:
        say("sweep: the same command resumes it (finished runs are skipped)")
        return stop_code
    if done < len(plan.runs):
        say("sweep: the same command resumes it (finished runs are skipped)")
        return EXIT_FAILED
    if queued:
        say(f"sweep: follow a run with llmtrain follow RUN_DIR; compare them once they end: llmtrain compare "
            f"{plan.dir}")
    else:
        say(f"sweep: compare the runs: llmtrain compare {plan.dir}")
    return EXIT_OK
