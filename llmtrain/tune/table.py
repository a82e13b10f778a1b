"""The tune's one table: each trial's estimate against its measurement, and whether it fit. Its MFU column only
when a trial has one to show (rundir/mfu_field.py); else one line says why. Then each trial's spread and, for a
refinement, its gain over its layout and whether that is beyond the noise (noise.py)."""

from __future__ import annotations

from rich.console import Console

from llmtrain.console import fold_table, plain
from llmtrain.rundir.mfu_field import not_shown_line
from llmtrain.tune import noise
from llmtrain.tune.trials import FAILED, Trial

SPREAD = "q1-q3 tokens/s"


def fit_cell(trial: Trial) -> str:
    if trial.fit == FAILED:
        return f"failed: {trial.reason}"
    return trial.fit + (f" ({trial.reason})" if trial.reason else "")


def spread_cell(trial: Trial) -> str:
    """The middle half of the trial's steps' tokens/s (its noise, noise.py)."""
    if not trial.measured or trial.tokens_per_s_q1 is None or trial.tokens_per_s_q3 is None:
        return "-"
    return f"{trial.tokens_per_s_q1:,.0f}-{trial.tokens_per_s_q3:,.0f}"


def vs_layout_cell(compared: tuple[str, float] | None) -> str:
    """A refinement against its layout: the gain, and whether it is beyond both trials' spreads."""
    if compared is None:
        return ""
    verdict, gain = compared
    return f"{gain:+.1%}, {verdict}"


def ratio(trial: Trial) -> float | None:
    """Measured over estimated tokens/s."""
    if not trial.measured or not trial.estimated_tokens_per_s:
        return None
    return trial.tokens_per_s / trial.estimated_tokens_per_s


def render(trials: list[Trial], title: str, console: Console, compute_dtype: str | None = None) -> None:
    with_mfu = any(t.shown_mfu is not None for t in trials)
    table = fold_table(title)
    table.add_column("layout")
    for col in ("est. tokens/s", "tokens/s", *(("MFU",) if with_mfu else ()), "peak GiB", "measured/est."):
        table.add_column(col, justify="right")
    table.add_column("fit")
    table.add_column(SPREAD, justify="right")
    verdicts = noise.compared(trials)
    if verdicts:
        table.add_column("vs. layout")
    for t in trials:
        r = ratio(t)
        mfu = (f"{t.shown_mfu:.2%}" if t.shown_mfu is not None else "-",) if with_mfu else ()
        table.add_row(t.layout, f"{t.estimated_tokens_per_s:,.0f}",
                      f"{t.tokens_per_s:,.0f}" if t.measured else "-", *mfu,
                      f"{t.peak_gib:,.2f}" if t.measured and t.peak_gib is not None else "-",
                      f"{r:.2f}" if r is not None else "-", fit_cell(t), spread_cell(t),
                      *((vs_layout_cell(verdicts.get(t.layout)),) if verdicts else ()))
    console.print(table)
    if any(t.measured and t.shown_mfu is None for t in trials):
        unrecorded = [{"mfu": t.mfu} for t in trials if t.measured and t.mfu is not None and t.mfu_peak_tflops is None]
        plain(not_shown_line(unrecorded, compute_dtype), console=console)


def fastest(trials: list[Trial]) -> Trial | None:
    """The measured fastest (ties: the first, which the plan ranked higher)."""
    measured = [t for t in trials if t.measured]
    return max(measured, key=lambda t: t.tokens_per_s) if measured else None
