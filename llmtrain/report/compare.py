"""`llmtrain compare RUN_DIR... | SWEEP_DIR`: one table of the runs (the swept keys of a sweep, else the config
keys that differ between them; final loss, best val loss, tokens/s, MFU where a run has one to show
(rundir/mfu_field.py; else a line why), steps) sorted by best val loss, a line for a global batch or token count
that differs between them, and one PNG with every loss curve. Two runs also get
the old side-by-side view: their losses at evenly spaced steps and the largest divergence (e.g. an fp16 run
against fp32, or a new layout against a reference)."""

from __future__ import annotations

import argparse
import os
import statistics
from dataclasses import dataclass, field
from functools import cached_property

from llmtrain.config.errors import ConfigError
from llmtrain.console import fold_table, get_console, plain
from llmtrain.report.plotting import NO_PLOTS, PLOT_EXTRA, pyplot
from llmtrain.report.run_report import fmt_loss, fmt_mfu, fmt_tokens_per_s
from llmtrain.rundir.metrics_file import read_metrics
from llmtrain.rundir.mfu_field import not_shown, shown_mfu
from llmtrain.rundir.atomic import atomic_path
from llmtrain.rundir.paths import RunPaths
from llmtrain.sweep import SWEEP_NAME_VAR

PLOT_NAME = "compare.png"
# Keys that differ between any two runs without making them different experiments (a sweep's name is set by the
# sweep, as run.dir is).
NOT_A_DIFFERENCE = ("run.dir", "checkpoint.resume", "cluster.master_port", "cluster.node_rank", "run.overwrite",
                    f"env.{SWEEP_NAME_VAR}")


def add_compare_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dirs", nargs="+", metavar="DIR",
                        help="run directories, or a sweep directory (it holds sweep.yaml: its runs)")
    parser.add_argument("--plot", "--png", "--out", dest="plot", default=None, metavar="FILE",
                        help=f"the PNG of every loss curve, or a folder to write {PLOT_NAME} into (default: "
                             f"{PLOT_NAME} in the current folder, when matplotlib is installed); needs matplotlib: "
                             f"{PLOT_EXTRA}")
    parser.add_argument("--rows", type=int, default=20,
                        help="two runs: rows of their step-by-step loss table (evenly spaced steps; default 20)")


# ---------------------------------------------------------------------------------------------------- runs

@dataclass
class Run:
    dir: str
    rows: list[dict]
    cfg: object = None  # config.yaml, typed; None when the directory has none
    params: dict[str, str] = field(default_factory=dict)  # the swept values, for a run of a sweep

    @property
    def name(self) -> str:
        return os.path.basename(os.path.normpath(self.dir))

    def series(self, key: str) -> dict[int, float]:
        return {r["step"]: float(r[key]) for r in self.rows if isinstance(r.get("step"), int) and _number(r.get(key))}

    @property
    def train(self) -> list[dict]:
        return [r for r in self.rows if _number(r.get("loss"))]

    @property
    def final_loss(self) -> float | None:
        return float(self.train[-1]["loss"]) if self.train else None

    @property
    def best_val_loss(self) -> float | None:
        return min(self.series("val_loss").values(), default=None)

    def median_after_warmup(self, key: str) -> float | None:
        """As llmtrain report gives it: the first logged step (warm-up) is left out when there are others."""
        values = [float(r[key]) for r in self.train if _number(r.get(key))]
        return statistics.median(values[1:] if len(values) > 1 else values) if values else None

    @property
    def median_mfu(self) -> float | None:
        """The median MFU after the warm-up, of the rows that have one to show."""
        values = [m for m in (shown_mfu(r) for r in self.train) if m is not None]
        return statistics.median(values[1:] if len(values) > 1 else values) if values else None

    @property
    def last_step(self) -> int | None:
        return max((r["step"] for r in self.rows if isinstance(r.get("step"), int)), default=None)

    @property
    def tokens_seen(self) -> int | None:
        tokens = [r["tokens"] for r in self.train if _number(r.get("tokens"))]
        return int(tokens[-1]) if tokens else None

    @cached_property
    def flat_config(self) -> dict[str, object]:
        """config.yaml as {dotted key: value} ({} when there is none)."""
        if self.cfg is None:
            return {}
        from llmtrain.config.compose import flat_keys, to_plain

        return flat_keys(to_plain(self.cfg))

    @property
    def global_batch(self) -> tuple[int, int] | None:
        """(sequences, tokens per sequence) of one optimizer step."""
        if self.cfg is None:
            return None
        return int(self.cfg.train.global_batch_size), int(self.cfg.model.seq_len)


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def load_runs(dirs: list[str]) -> tuple[list[Run], list[str] | None]:
    """The runs named on the command line (a sweep directory stands for its runs), and the swept keys when the
    command named one sweep directory (else None: the table shows the keys that differ)."""
    from llmtrain.sweep import record

    runs, swept = [], None
    for d in dirs:
        sweep = record.read(d)
        if sweep is None:
            runs.append(_load_run(d, {}, required=True))
            continue
        params = [run.get("params") or {} for run in sweep["runs"] if isinstance(run, dict)]
        runs += [_load_run(path, p, required=False) for path, p in zip(record.run_dirs(d, sweep), params)]
        if len(dirs) == 1:
            swept = [str(k) for k in sweep.get("swept") or []]
    if not any(run.rows for run in runs):
        raise ConfigError(dirs[0], "no run has metrics yet (metrics.jsonl)")
    return runs, swept


def _load_run(run_dir: str, params: dict, required: bool) -> Run:
    """A run directory's metrics and config; a run of a sweep that has not started yet has neither."""
    metrics = RunPaths(run_dir).metrics
    if required and not os.path.isfile(metrics):
        raise ConfigError(run_dir, "not a run directory (no metrics.jsonl) nor a sweep directory (no sweep.yaml)")
    cfg = None
    if os.path.isfile(RunPaths(run_dir).config):
        from llmtrain.config import load_run_config

        cfg = load_run_config(RunPaths(run_dir).config)
    return Run(run_dir, read_metrics(metrics) if os.path.isfile(metrics) else [], cfg,
               {str(k): str(v) for k, v in params.items()})


def differing_keys(runs: list[Run]) -> list[str]:
    """The config keys whose values are not the same in every run's config.yaml; a key that is absent, null or an
    empty mapping is unset alike (`env: {}` in one run, `env.NAME: null` or no such key in another)."""
    flat = [run.flat_config for run in runs if run.cfg is not None]
    keys = sorted({k for f in flat for k in f} - set(NOT_A_DIFFERENCE))
    return [k for k in keys if len({_compared(f.get(k)) for f in flat}) > 1]


def _compared(value) -> str:
    return "<unset>" if value is None or value == {} else repr(value)


def key_value(run: Run, key: str, swept: bool) -> str:
    if swept:
        return run.params.get(key, "-")
    value = run.flat_config.get(key, "-")
    if key == "data.sources" and isinstance(value, list):  # a mixture by name and weight: `web 0.7, code 0.3`
        from llmtrain.data.mixture_config import source_names

        return ", ".join(f"{name} {source.get('weight')}" for name, source in zip(source_names(value), value))
    return str(value)


def ranked(runs: list[Run]) -> list[Run]:
    """By best val loss; runs without one last, in their given order."""
    return sorted(runs, key=lambda run: (run.best_val_loss is None, run.best_val_loss or 0.0))


# ---------------------------------------------------------------------------------------------------- table

def _fmt(value, fmt) -> str:
    return "-" if value is None else fmt(value)


def runs_table(runs: list[Run], keys: list[str], swept: bool, title: str):
    table = fold_table(title)
    table.add_column("run")
    for key in keys:
        table.add_column(key)
    with_mfu = any(run.median_mfu is not None for run in runs)
    for col in ("final loss", "best val loss", "tokens/s", *(("MFU",) if with_mfu else ()), "steps"):
        table.add_column(col, justify="right")
    for run in runs:
        max_steps = run.cfg.train.max_steps if run.cfg is not None else None
        steps = "-" if run.last_step is None else f"{run.last_step}" + (f"/{max_steps}" if max_steps else "")
        table.add_row(run.name, *(key_value(run, k, swept) for k in keys), _fmt(run.final_loss, fmt_loss),
                      _fmt(run.best_val_loss, fmt_loss), _fmt(run.median_after_warmup("tokens_per_s"),
                                                              fmt_tokens_per_s),
                      *((_fmt(run.median_mfu, fmt_mfu),) if with_mfu else ()), steps)
    return table


def mfu_line(runs: list[Run]) -> str | None:
    """Why runs with training rows show no MFU (naming them when others do); None when every one shows it."""
    without = [run for run in runs if run.train and run.median_mfu is None]
    if not without:
        return None
    dtypes = {run.cfg.precision.compute_dtype for run in without if run.cfg is not None}
    why = not_shown([r for run in without for r in run.train], dtypes.pop() if len(dtypes) == 1 else None)
    if len(without) == len([run for run in runs if run.train]):
        return f"MFU {why}"
    return f"MFU {why.replace('not shown', 'not shown for ' + ', '.join(run.name for run in without), 1)}"


def difference_notes(runs: list[Run]) -> list[str]:
    """A line for each of: a global batch, or a count of tokens seen, that is not the same in every run."""
    notes = []
    batches = _grouped(runs, lambda run: run.global_batch)
    if len(batches) > 1:
        notes.append("note: the global batch differs between the runs, so a step is not the same amount of data: "
                     + "; ".join(f"{b[0]} x {b[1]} = {b[0] * b[1]:,} tokens per step in {', '.join(names)}"
                                 for b, names in batches.items()))
    seen = _grouped(runs, lambda run: run.tokens_seen)
    if len(seen) > 1:
        notes.append("note: the runs saw different numbers of tokens: "
                     + "; ".join(f"{tokens:,} in {', '.join(names)}" for tokens, names in seen.items()))
    return notes


def _grouped(runs: list[Run], value) -> dict:
    groups: dict = {}
    for run in runs:
        if run.rows and value(run) is not None:
            groups.setdefault(value(run), []).append(run.name)
    return groups


def divergence(a: dict[int, float], b: dict[int, float]) -> tuple[list[int], int | None, float]:
    common = sorted(set(a) & set(b))
    if not common:
        return common, None, 0.0
    worst = max(common, key=lambda s: abs(a[s] - b[s]))
    return common, worst, abs(a[worst] - b[worst])


def print_pair(console, a: Run, b: Run, rows: int) -> None:
    """Two runs: their train losses at evenly spaced steps, and the largest divergence."""
    la, lb = a.series("loss"), b.series("loss")
    common, worst, worst_diff = divergence(la, lb)
    if not common:
        console.print(f"{a.name} and {b.name} have no logged step in common", highlight=False)
        return
    table = fold_table(f"train loss: {a.name} vs {b.name}")
    for col in ("step", a.name, b.name, "diff"):
        table.add_column(col, justify="right")
    stride = max(1, len(common) // max(1, rows))
    for s in sorted(set(common[::stride]) | {common[-1], worst}):
        table.add_row(str(s), f"{la[s]:.6f}", f"{lb[s]:.6f}", f"{lb[s] - la[s]:+.2e}")
    console.print(table)
    _, vworst, vdiff = divergence(a.series("val_loss"), b.series("val_loss"))
    console.print(f"largest train-loss divergence: {worst_diff:.3e} at step {worst} ({len(common)} common steps)"
                  + (f"; largest val-loss divergence: {vdiff:.3e} at step {vworst}" if vworst is not None else ""),
                  highlight=False)


# ---------------------------------------------------------------------------------------------------- plot

def plot(plt, runs: list[Run], path: str) -> None:
    """Every run's train loss (a line) and val loss (dots of the same colour); with two runs, their difference
    below. Written atomically."""
    pair = len(runs) == 2
    if pair:
        fig, (ax, below) = plt.subplots(2, 1, figsize=(9, 6.5), sharex=True, height_ratios=(3, 1))
    else:
        fig, ax = plt.subplots(figsize=(9, 5.5))
    for run in runs:
        train, val = run.series("loss"), run.series("val_loss")
        line, = ax.plot(sorted(train), [train[s] for s in sorted(train)], label=run.name, linewidth=1.2)
        if val:
            ax.plot(sorted(val), [val[s] for s in sorted(val)], "o", color=line.get_color(), markersize=4)
    ax.set(ylabel="loss (line: train, dots: val)", title="loss")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    if pair:
        a, b = runs[0].series("loss"), runs[1].series("loss")
        common = sorted(set(a) & set(b))
        below.plot(common, [b[s] - a[s] for s in common], color="tab:red")
        below.set_ylabel(f"{runs[1].name} - {runs[0].name}", fontsize="small")
        below.grid(alpha=0.3)
    (below if pair else ax).set_xlabel("step")
    ax.xaxis.get_major_locator().set_params(integer=True)  # steps: no 1.25
    fig.tight_layout()
    try:
        with atomic_path(path) as tmp:
            fig.savefig(tmp, dpi=100, format="png")
    except OSError as e:
        raise ConfigError("--plot", f"cannot write {path}: {e.strerror or e}") from None
    finally:
        plt.close(fig)
        if os.path.exists(tmp):
            os.remove(tmp)


# ---------------------------------------------------------------------------------------------------- command

def plot_path(asked: str | None) -> str:
    """Where the PNG goes: the file asked for, PLOT_NAME in a folder asked for, else in the current folder (never
    into a run directory, which holds what its run wrote)."""
    if asked is None:
        return PLOT_NAME
    return os.path.join(asked, PLOT_NAME) if os.path.isdir(asked) else asked


def run_compare(args) -> int:
    plt = pyplot()
    if plt is None and args.plot:  # a PNG asked for by name: refuse before printing anything
        raise ConfigError("--plot", f"{args.plot} needs matplotlib, which is not installed: {PLOT_EXTRA}; without "
                                    "--plot, compare prints the table alone")
    runs, swept = load_runs(args.dirs)
    keys = swept if swept is not None else differing_keys(runs)
    console = get_console()
    what = f"sweep {os.path.basename(os.path.normpath(args.dirs[0]))}" if swept is not None else "runs"
    console.print(runs_table(ranked(runs), keys, swept is not None,
                             f"{what}: {len(runs)} run(s), best val loss first"))
    for note in difference_notes(runs) + [line for line in (mfu_line(runs),) if line]:
        plain(note, console=console)
    if len(runs) == 2:
        print_pair(console, runs[0], runs[1], args.rows)
    if plt is None:
        plain(NO_PLOTS, console=console)
        return 0
    path = plot_path(args.plot)
    plot(plt, [run for run in runs if run.rows], path)
    plain(f"plot: {path}", console=console)
    return 0
