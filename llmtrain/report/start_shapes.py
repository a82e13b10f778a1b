"""Each start's node count and layout in `llmtrain report`: one row under the goodput summary, from goodput.json's
entries (`nodes` and `layout`, written at each start's end by launch/goodput_entry.py), with the start's own
goodput, when the run started more than once or once on fewer nodes than cluster.nnodes."""

from __future__ import annotations

import time

from llmtrain.jobs.status import start_words


def _clock(started_at) -> str | None:
    """The start's wall-clock time as HH:MM (this machine's time zone, as job.json's times are written)."""
    return time.strftime("%H:%M", time.localtime(started_at)) if isinstance(started_at, (int, float)) else None


def _goodput(entry: dict) -> str | None:
    share = entry.get("goodput")
    return f"goodput {share:.1%}" if isinstance(share, (int, float)) else None


def summary_rows(starts: list[dict], nnodes: int | None) -> list[tuple[str, str]]:
    """("  starts", "2 nodes dp=2 tp=1 pp=1 (06:06, goodput 71.3%), 1 of 2 nodes ...") for the summary table;
    nothing when no entry has a shape (a ledger written before starts had one), or one start had all its nodes."""
    shaped = [s for s in starts if isinstance(s.get("nodes"), int)]
    fewer = isinstance(nnodes, int) and any(s["nodes"] < nnodes for s in shaped)
    if not shaped or (len(shaped) < 2 and not fewer):
        return []
    return [("  starts", ", ".join(start_words(s["nodes"], nnodes, s.get("layout"), _clock(s.get("started_at")),
                                               _goodput(s)) for s in shaped))]
