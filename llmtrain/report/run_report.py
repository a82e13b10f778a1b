"""`llmtrain report RUN_DIR`: plots (loss, learning rate, throughput) and a summary table of one run, read from
its metrics.jsonl and config.yaml, with the stragglers named and the goodput ledger (goodput.json; each start's
nodes and layout: report/start_shapes.py). MFU only from rows that have one to show (rundir/mfu_field.py);
otherwise one line says why. A mixture-of-experts run also gets its router's losses beside the loss and the
expert-load heat map (report/expert_load.py)."""

from __future__ import annotations

import argparse
import os
import statistics

from omegaconf import OmegaConf

from llmtrain.config.errors import ConfigError
from llmtrain.console import fold_table, get_console, plain
from llmtrain.jobs.status import straggler_line
from llmtrain.report import expert_load, spike_marks, start_shapes
from llmtrain.report.plotting import NO_PLOTS, PLOT_EXTRA, pyplot
from llmtrain.report.source_table import plot_source_val_loss, source_rows, val_loss_step
from llmtrain.rundir import goodput
from llmtrain.rundir.metrics_file import read_metrics
from llmtrain.rundir.mfu_field import not_shown_line, shown_mfu
from llmtrain.rundir.atomic import atomic_path
from llmtrain.rundir.paths import RunPaths


def add_report_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR", help="run directory (holds metrics.jsonl and config.yaml)")
    parser.add_argument("--out", default=None, metavar="DIR",
                        help=f"where the PNGs go (default RUN_DIR/report); they need matplotlib ({PLOT_EXTRA}): "
                             "without it the summary table alone is printed")
    parser.add_argument("--tensorboard", action="store_true",
                        help="also export metrics.jsonl as TensorBoard event files to OUT/tensorboard; needs the "
                             "tensorboard extra (pip install 'llmtrain[tensorboard]')")


# ---------------------------------------------------------------------------------------------------- formatting
# The summary table's number formats (tests format their expected values with these too).

def fmt_loss(x: float) -> str:
    return f"{x:.4f}"


def fmt_tokens_per_s(x: float) -> str:
    return f"{x:,.0f}"


def fmt_seconds(x: float) -> str:
    return f"{x:.3f} s"


def fmt_mfu(x: float) -> str:
    return f"{100 * x:.1f}%"


def fmt_duration(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


# ---------------------------------------------------------------------------------------------------- data

def _num(row: dict, key: str) -> float | None:
    v = row.get(key)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _series(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
    pts = [(r["step"], _num(r, key)) for r in rows if "step" in r and _num(r, key) is not None]
    return [p[0] for p in pts], [p[1] for p in pts]


def _median_after_warmup(train_rows: list[dict], key: str) -> float | None:
    """Median of `key` over the train rows, the first logged one (warm-up) left out when there are others."""
    values = [v for v in (_num(r, key) for r in train_rows) if v is not None]
    first = _num(train_rows[0], key) if train_rows else None
    if first is not None and len(values) > 1:
        values = values[1:]
    return statistics.median(values) if values else None


def _shown_mfu_rows(rows: list[dict]) -> list[dict]:
    """The rows with their MFU as it may be shown (None where it may not)."""
    return [{**r, "mfu": shown_mfu(r)} for r in rows]


def mfu_note(rows: list[dict], cfg=None) -> str | None:
    """The line saying why the report shows no MFU; None when a train row has one to show, or there is none."""
    train = [r for r in rows if _num(r, "loss") is not None]
    if not train or any(shown_mfu(r) is not None for r in train):
        return None
    return not_shown_line(train, cfg.precision.compute_dtype if cfg is not None else None)


def summarize(run_dir: str, rows: list[dict], cfg=None) -> list[tuple[str, str]]:
    """(label, value) rows of the summary table."""
    train = [r for r in rows if _num(r, "loss") is not None]
    evals = [r for r in rows if _num(r, "val_loss") is not None]
    out: list[tuple[str, str]] = []

    def sel(key: str, default=None):
        if cfg is None:
            return default
        node = cfg
        for part in key.split("."):
            node = node.get(part) if hasattr(node, "get") else None
            if node is None:
                return default
        return node

    out.append(("run", str(sel("run.name") or os.path.basename(os.path.normpath(run_dir)))))
    if cfg is not None:
        out.append(("model", str(sel("model.name", "?"))))
        layout = "  ".join(f"{k}={sel(f'parallel.{k}', 'auto')}" for k in ("dp", "tp", "pp"))
        out.append(("layout", layout))
        out.append(("precision", str(sel("precision.name", "?"))))
    last_step = max((r["step"] for r in rows if isinstance(r.get("step"), int)), default=None)
    max_steps = sel("train.max_steps")
    steps = "-" if last_step is None else str(last_step)
    out.append(("steps", steps + (f" / {max_steps}" if max_steps is not None else "")))
    tokens = [v for v in (_num(r, "tokens") for r in train) if v is not None]
    if tokens:
        out.append(("tokens", f"{int(max(tokens)):,}"))
    if train:
        losses = [_num(r, "loss") for r in train]
        out.append(("train loss (first / last / min)",
                    f"{fmt_loss(losses[0])} / {fmt_loss(losses[-1])} / {fmt_loss(min(losses))}"))
    if evals:
        last = evals[-1]
        out.append(("val loss (last)", f"{fmt_loss(_num(last, 'val_loss'))} at step {last.get('step', '?')}"))
    median_tps = _median_after_warmup(train, "tokens_per_s")
    if median_tps is not None:
        out.append(("tokens/s (median)", fmt_tokens_per_s(median_tps)))
    median_step = _median_after_warmup(train, "step_time_s")
    if median_step is not None:
        out.append(("step time (median)", fmt_seconds(median_step)))
    median_tflops = _median_after_warmup(train, "tflops")
    if median_tflops is not None:
        out.append(("TFLOP/s (median)", f"{median_tflops:.2f}"))
    median_mfu = _median_after_warmup(_shown_mfu_rows(train), "mfu")
    if median_mfu is not None:
        out.append(("MFU (median)", fmt_mfu(median_mfu)))
    mem = [v for v in (_num(r, "mem_gib") for r in train) if v is not None]
    if mem:
        out.append(("peak memory", f"{max(mem):.2f} GiB"))
    skipped = [v for v in (_num(r, "skipped_steps") for r in train) if v is not None]
    if skipped:
        out.append(("skipped steps (overflow)", f"{int(skipped[-1])}"))
    elapsed = [v for v in (_num(r, "elapsed_s") for r in rows) if v is not None]
    if elapsed:
        out.append(("elapsed", fmt_duration(max(elapsed))))
    named = [r for r in rows if r.get("stragglers")]
    if named:
        out.append(("stragglers", straggler_line({"step": named[-1].get("step"), "stragglers": named[-1]["stragglers"]})
                    + f" ({len(named)} time(s) in all)"))
    out += expert_load.summary_rows(rows)
    out += spike_marks.summary_rows(run_dir)
    starts = goodput.read_ledger(run_dir)
    out += [(label if i == 0 else f"  {label}", value)
            for i, (label, value) in enumerate(goodput.summary_lines(starts))]
    out += start_shapes.summary_rows(starts, sel("cluster.nnodes"))
    return out


# ---------------------------------------------------------------------------------------------------- plots

def _save(plt, fig, path: str) -> None:
    fig.tight_layout()
    try:
        with atomic_path(path) as tmp:
            fig.savefig(tmp, dpi=100, format="png")
    finally:
        plt.close(fig)


def _no_data(ax, what: str) -> None:
    ax.text(0.5, 0.5, f"no {what} logged", ha="center", va="center", transform=ax.transAxes, color="gray")


def plot_all(plt, rows: list[dict], out_dir: str, title: str, top_k: int | None = None) -> list[str]:
    train = [r for r in rows if _num(r, "loss") is not None]
    paths = []

    router = expert_load.has_router_losses(train)  # a MoE run: its router's losses beside the loss
    fig, axes = plt.subplots(1, 2 if router else 1, figsize=(14 if router else 8, 4.5))
    ax = axes[0] if router else axes
    steps, loss = _series(train, "loss")
    vsteps, vloss = _series(rows, "val_loss")
    if steps:
        ax.plot(steps, loss, label="train loss", linewidth=1.2)
    if vsteps:
        ax.plot(vsteps, vloss, "o", color="tab:red", label="val loss")
    spike_marks.mark_spikes(ax, rows)  # the steps a spike was rolled back from or warned of
    if not steps and not vsteps:
        _no_data(ax, "loss")
    else:
        ax.legend()
    ax.set(xlabel="step", ylabel="loss", title=f"{title}: loss")
    ax.grid(alpha=0.3)
    if router:
        expert_load.plot_router_losses(axes[1], train, title)
    paths.append(os.path.join(out_dir, "loss.png"))
    _save(plt, fig, paths[-1])

    fig, ax = plt.subplots(figsize=(8, 3.5))
    steps, lr = _series(train, "lr")
    if steps:
        ax.plot(steps, lr, color="tab:green")
        ax.ticklabel_format(axis="y", style="sci", scilimits=(-2, 3))
    else:
        _no_data(ax, "learning rate")
    ax.set(xlabel="step", ylabel="learning rate", title=f"{title}: learning rate")
    ax.grid(alpha=0.3)
    paths.append(os.path.join(out_dir, "lr.png"))
    _save(plt, fig, paths[-1])

    fig, ax = plt.subplots(figsize=(8, 4))
    steps, tps = _series(train, "tokens_per_s")
    if steps:
        ax.plot(steps, tps, color="tab:blue", label="tokens/s")
    else:
        _no_data(ax, "throughput")
    ax.set(xlabel="step", ylabel="tokens/s", title=f"{title}: throughput")
    ax.grid(alpha=0.3)
    msteps, mfu = _series(_shown_mfu_rows(train), "mfu")
    if msteps:
        ax2 = ax.twinx()
        ax2.plot(msteps, [100 * m for m in mfu], color="tab:orange", label="MFU", linewidth=1.0)
        ax2.set_ylabel("MFU (%)")
        lines = ax.get_lines() + ax2.get_lines()
        ax.legend(lines, [line.get_label() for line in lines], loc="lower right")
    paths.append(os.path.join(out_dir, "throughput.png"))
    _save(plt, fig, paths[-1])
    extra = [plot_source_val_loss(plt, rows, out_dir, title, _save),
             expert_load.plot_expert_load(plt, rows, out_dir, title, _save, top_k)]
    return paths + [p for p in extra if p]


# ---------------------------------------------------------------------------------------------------- tensorboard

def export_tensorboard(rows: list[dict], log_dir: str, metrics_path: str) -> tuple[str, int]:
    """Write `rows` as an event file in log_dir: train rows as train/KEY, eval rows as val/KEY (val_loss ->
    val/loss). Wall times are reconstructed from elapsed_s and the metrics file's modification time. Returns the
    file and how many train and val rows went into it."""
    from llmtrain.train.trackers.tensorboard import TensorBoardWriter

    elapsed = [v for v in (_num(r, "elapsed_s") for r in rows) if v is not None]
    start = os.path.getmtime(metrics_path) - (max(elapsed) if elapsed else 0.0)
    written = 0
    with TensorBoardWriter(log_dir, key="--tensorboard") as writer:
        for r in rows:
            if not isinstance(r.get("step"), int):
                continue
            wall = start + _num(r, "elapsed_s") if _num(r, "elapsed_s") is not None else None
            groups = []  # a row may hold both a train step and an eval
            if _num(r, "loss") is not None:
                shown = {**r, "mfu": shown_mfu(r)} if "mfu" in r else r
                groups.append({f"train/{k}": v for k, v in shown.items() if k not in ("step", "val_loss")})
            if _num(r, "val_loss") is not None:
                groups.append({"val/loss": r["val_loss"]})
            for values in groups:
                if writer.add_scalars(r["step"], values, wall_time=wall):
                    written += 1
    return writer.path, written


# ---------------------------------------------------------------------------------------------------- command

def run_report(args) -> int:
    run_dir = args.run_dir
    metrics_path = RunPaths(run_dir).metrics
    if not os.path.isfile(metrics_path):
        raise ConfigError(run_dir, "not a run directory: no metrics.jsonl")
    rows = read_metrics(metrics_path)
    cfg = None
    config_path = RunPaths(run_dir).config
    if os.path.isfile(config_path):
        from llmtrain.config.compose import load_run_config

        cfg = load_run_config(config_path)
    out_dir = getattr(args, "out", None) or RunPaths(run_dir).report

    summary = summarize(run_dir, rows, cfg)
    title = summary[0][1]
    plt = pyplot()
    if getattr(args, "tensorboard", False):
        from llmtrain.train.trackers.tensorboard import tensorboard_missing

        missing = tensorboard_missing()
        if missing:
            raise ConfigError("--tensorboard", missing)
    paths = []
    if plt is not None:
        os.makedirs(out_dir, exist_ok=True)
        moe = OmegaConf.select(cfg, "model.moe") if cfg is not None else None
        paths = plot_all(plt, rows, out_dir, title, moe.top_k if moe else None)

    console = get_console()
    table = fold_table(f"run report: {run_dir}", show_header=False)
    table.add_column("", style="bold")
    table.add_column("", justify="right")
    for label, value in summary:
        table.add_row(label, value)
    console.print(table)
    sources = source_rows(rows)
    if sources:
        at = val_loss_step(rows)
        table = fold_table("data=mix sources" + (f" (val loss at step {at})" if at is not None else ""))
        for col in ("source", "tokens", "share", "val loss"):
            table.add_column(col, justify="left" if col == "source" else "right")
        for row in sources:
            table.add_row(*row)
        console.print(table)
    note = mfu_note(rows, cfg)
    if note:
        plain(note, console=console)
    if not rows:
        console.print("metrics.jsonl has no rows yet", highlight=False)
    plain("plots: " + ", ".join(paths) if plt is not None else NO_PLOTS, console=console)
    if getattr(args, "tensorboard", False):
        tb_dir = os.path.join(out_dir, "tensorboard")
        path, n = export_tensorboard(rows, tb_dir, metrics_path)
        console.print(f"tensorboard: {n} train/val rows in {path} (view: tensorboard --logdir {tb_dir})",
                      highlight=False)
    return 0
