"""The tune's one table: each trial's estimate against its measurement, and whether it fit."""

from __future__ import annotations

from rich.console import Console

from llmtrain.console import fold_table
from llmtrain.tune.trials import FAILED, Trial


def fit_cell(trial: Trial) -> str:
    if trial.fit == FAILED:
        return f"failed: {trial.reason}"
    return trial.fit + (f" ({trial.reason})" if trial.reason else "")


def ratio(trial: Trial) -> float | None:
    """Measured over estimated tokens/s."""
    if not trial.measured or not trial.estimated_tokens_per_s:
        return None
    return trial.tokens_per_s / trial.estimated_tokens_per_s


def render(trials: list[Trial], title: str, console: Console) -> None:
    table = fold_table(title)
    table.add_column("layout")
    for col in ("est. tokens/s", "tokens/s", "MFU", "peak GiB", "measured/est."):
        table.add_column(col, justify="right")
    table.add_column("fit")
    for t in trials:
        r = ratio(t)
        table.add_row(t.layout, f"{t.estimated_tokens_per_s:,.0f}",
                      f"{t.tokens_per_s:,.0f}" if t.measured else "-",
                      f"{t.mfu:.2%}" if t.measured and t.mfu is not None else "-",
                      f"{t.peak_gib:,.2f}" if t.measured and t.peak_gib is not None else "-",
                      f"{r:.2f}" if r is not None else "-", fit_cell(t))
    console.print(table)


def fastest(trials: list[Trial]) -> Trial | None:
    """The measured fastest (ties: the first, which the plan ranked higher)."""
    measured = [t for t in trials if t.measured]
    return max(measured, key=lambda t: t.tokens_per_s) if measured else None
