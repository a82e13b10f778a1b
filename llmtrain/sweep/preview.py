"""`llmtrain launch -m --dry-run`: every combination with its run directory, then each run's commands (an sbatch
script per run with cluster=slurm). Everything was composed and validated first; nothing starts, nothing is
written."""

from __future__ import annotations

from llmtrain.console import fold_table, get_console, plain, say
from llmtrain.launch.backends.traits import traits_of
from llmtrain.sweep.plan import SweepPlan, naming_the_run


def sweep_table(plan: SweepPlan):
    table = fold_table(f"sweep {plan.name}: {len(plan.runs)} run(s) in {plan.dir}", expand=False)
    table.add_column("#", justify="right")
    for key in plan.swept_keys:
        table.add_column(key)
    table.add_column("run directory")
    for run in plan.runs:
        table.add_row(str(run.combination.index), *run.combination.swept.values(), run.dir)
    return table


def dry_run(plan: SweepPlan) -> int:
    from llmtrain.launch.backends.registry import get_backend

    previews = []
    for run in plan.runs:  # every backend is set up before anything is printed: a refusal is then one line
        with naming_the_run(run.name):
            previews.append(get_backend(run.cfg, run.dir).preview())
    console = get_console()
    console.print(sweep_table(plan))
    say(f"cluster={plan.backend}: " + (
        "each run is submitted as its own Slurm job, all at once" if traits_of(plan.backend).queued
        else "the runs start one after another"), console=console)
    for run, preview in zip(plan.runs, previews):
        console.rule(f"run {run.name} (nothing was started)")
        plain(preview, console=console)
    return 0
