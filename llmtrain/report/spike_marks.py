"""Loss spikes in `llmtrain report`: a summary line of the run's rollbacks (RUN_DIR/spikes.json) and a mark on the
loss curve at every spike step (metrics.jsonl's rollback and spike events)."""

from __future__ import annotations

from llmtrain.rundir.spike_record import read_rollbacks, summary


def summary_rows(run_dir: str) -> list[tuple[str, str]]:
    """("rollbacks", "N: each one") for the summary table; nothing without a rollback."""
    done = read_rollbacks(run_dir)
    return [("rollbacks", f"{len(done)}: " + "; ".join(summary(e) for e in done))] if done else []


def marks(rows: list[dict]) -> list[tuple[int, str]]:
    """(the spike's step, its label) of every spike event in the metrics rows: rolled back, or warned of."""
    out = []
    for r in rows:
        if r.get("event") == "rollback" and isinstance(r.get("spike_step"), int):
            out.append((r["spike_step"], f"spike at step {r['spike_step']}: rolled back to step {r.get('step')}"))
        elif r.get("event") == "spike" and isinstance(r.get("step"), int):
            out.append((r["step"], f"spike at step {r['step']} (warned)"))
    return out


def mark_spikes(ax, rows: list[dict]) -> int:
    """Dashed lines on the loss plot `ax` at every spike step (one legend entry); how many were drawn."""
    found = marks(rows)
    for i, (step, _) in enumerate(found):
        ax.axvline(step, color="tab:purple", linestyle="--", linewidth=0.9,
                   label="loss spike" if i == 0 else None)
    return len(found)
