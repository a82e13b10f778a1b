"""The `mfu` of a metrics.jsonl row as every reader shows it (the launcher's progress line, `status`, `report`,
`compare`, `tune`). The trainer writes `mfu` only against a known peak (a GPU profile's, or one given with
hardware.peak_tflops.<dtype>) and records that peak beside it (`peak_tflops`), never above 100%. Rows written before
the peak was recorded measured a CPU's peak at start-up, under whatever load there was, so their `mfu` could pass
100%: readers leave it out and say why, as they do for a run without a known peak."""

from __future__ import annotations

PEAK_KEY = "peak_tflops"  # the row's peak MFU is against, TFLOPS per device

NO_PEAK = "no known peak for this run's device (a CPU, or a GPU without a hardware profile)"
UNRECORDED = "these metrics do not record the peak their MFU was measured against (written by an older llmtrain)"


def shown_mfu(row: dict) -> float | None:
    """The row's MFU when it may be shown: measured against a recorded peak, above 0 and at most 100%."""
    mfu, peak = row.get("mfu"), row.get(PEAK_KEY)
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (mfu, peak)):
        return None
    return float(mfu) if 0 < mfu <= 1 else None


def not_shown(rows: list[dict], compute_dtype: str | None = None) -> str:
    """Why rows show no MFU, and how to give a peak: "not shown: ..."."""
    if any("mfu" in r and PEAK_KEY not in r for r in rows):
        return f"not shown: {UNRECORDED}"
    return f"not shown: {NO_PEAK}; give one with +hardware.peak_tflops.{compute_dtype or '<dtype>'}=<TFLOPS> to show it"


def not_shown_line(rows: list[dict], compute_dtype: str | None = None) -> str:
    """The one line a command prints instead of MFU figures."""
    return f"MFU {not_shown(rows, compute_dtype)}"
