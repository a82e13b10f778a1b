"""`llmtrain compare RUN_A RUN_B`: two loss curves side by side, as a table and a PNG, with the largest
divergence (e.g. an fp16 run against fp32, or a new layout against a reference)."""

from __future__ import annotations

import argparse
import os

from llmtrain.config.errors import ConfigError
from llmtrain.console import fold_table, get_console
from llmtrain.train.metrics import read_metrics


def add_compare_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_a", metavar="RUN_A", help="run directory (the reference)")
    parser.add_argument("run_b", metavar="RUN_B", help="run directory to compare")
    parser.add_argument("--png", default=None, metavar="FILE",
                        help="plot file (default RUN_B/compare.png); needs matplotlib (pip install matplotlib)")
    parser.add_argument("--rows", type=int, default=20, help="table rows (evenly spaced steps; default 20)")


def losses(run_dir: str, key: str = "loss") -> dict[int, float]:
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.isfile(path):
        raise ConfigError(run_dir, "not a run directory: no metrics.jsonl")
    return {r["step"]: r[key] for r in read_metrics(path) if r.get(key) is not None}


def divergence(a: dict[int, float], b: dict[int, float]) -> tuple[list[int], int | None, float]:
    common = sorted(set(a) & set(b))
    if not common:
        return common, None, 0.0
    worst = max(common, key=lambda s: abs(a[s] - b[s]))
    return common, worst, abs(a[worst] - b[worst])


def plot(a: dict[int, float], b: dict[int, float], names: tuple[str, str], path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError("--png", "the plot needs matplotlib: pip install matplotlib (or llmtrain[plot])") from None
    common = sorted(set(a) & set(b))
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True, height_ratios=(3, 1))
    top.plot(sorted(a), [a[s] for s in sorted(a)], label=names[0])
    top.plot(sorted(b), [b[s] for s in sorted(b)], label=names[1], linestyle="--")
    top.set_ylabel("train loss")
    top.legend()
    top.grid(alpha=0.3)
    bottom.plot(common, [b[s] - a[s] for s in common], color="tab:red")
    bottom.set_ylabel(f"{names[1]} - {names[0]}")
    bottom.set_xlabel("step")
    bottom.grid(alpha=0.3)
    fig.tight_layout()
    tmp = path + ".tmp.png"
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    os.replace(tmp, path)


def run_compare(args) -> int:
    a, b = losses(args.run_a), losses(args.run_b)
    names = (os.path.basename(os.path.normpath(args.run_a)), os.path.basename(os.path.normpath(args.run_b)))
    common, worst, worst_diff = divergence(a, b)
    console = get_console()
    if not common:
        raise ConfigError(args.run_b, f"no logged step in common with {args.run_a}")
    table = fold_table(f"train loss: {names[0]} vs {names[1]}")
    for col in ("step", names[0], names[1], "diff"):
        table.add_column(col, justify="right")
    stride = max(1, len(common) // max(1, args.rows))
    shown = sorted(set(common[::stride]) | {common[-1], worst})
    for s in shown:
        table.add_row(str(s), f"{a[s]:.6f}", f"{b[s]:.6f}", f"{b[s] - a[s]:+.2e}")
    console.print(table)
    va, vb = losses(args.run_a, "val_loss"), losses(args.run_b, "val_loss")
    _, vworst, vdiff = divergence(va, vb)
    console.print(f"largest train-loss divergence: {worst_diff:.3e} at step {worst} ({len(common)} common steps)"
                  + (f"; largest val-loss divergence: {vdiff:.3e} at step {vworst}" if vworst is not None else ""),
                  highlight=False)
    png = args.png or os.path.join(args.run_b, "compare.png")
    plot(a, b, names, png)
    console.print(f"plot: {png}", highlight=False)
    return 0
