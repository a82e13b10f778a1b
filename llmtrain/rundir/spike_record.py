"""RUN_DIR/spikes.json: {"rollbacks": [entry, ...]}, every loss-spike rollback of the run, oldest first. Rank 0 of
the trainer writes it the moment it rolls back (llmtrain.train.rollback), before the next save, so a launch that
resumes an older checkpoint still skips the samples; `llmtrain status` and `report` read it. The file is rewritten
whole and atomically.

An entry: step (the spike), checkpoint_step (the checkpoint rolled back to), start and end (the global samples
[start, end) skipped), metric, value, why (the rule that fired).
"""

from __future__ import annotations

from llmtrain.rundir.atomic import atomic_write_json
from llmtrain.rundir.json_list import read_entries
from llmtrain.rundir.paths import RunPaths


def read_rollbacks(run_dir: str) -> list[dict]:
    """Every rollback recorded in run_dir, oldest first; [] when there is no (readable) record."""
    return [e for e in read_entries(RunPaths(run_dir).spikes, "rollbacks")
            if isinstance(e.get("start"), int) and isinstance(e.get("end"), int)]


def add_rollback(run_dir: str, entry: dict) -> None:
    """Append one rollback to the record (an entry for the same skipped range replaces it)."""
    kept = [e for e in read_rollbacks(run_dir) if (e["start"], e["end"]) != (entry["start"], entry["end"])]
    atomic_write_json(RunPaths(run_dir).spikes, {"rollbacks": [*kept, entry]}, indent=1)


def merged(*records: list[dict]) -> list[dict]:
    """The rollbacks of several records (the run directory's, a checkpoint's), each skipped range once, by start."""
    out: dict[tuple[int, int], dict] = {}
    for record in records:
        for entry in record:
            out.setdefault((entry["start"], entry["end"]), entry)
    return sorted(out.values(), key=lambda e: (e["start"], e["end"]))


def skip_past(samples_seen: int, rollbacks: list[dict]) -> int:
    """Where the sample stream goes on from `samples_seen`: past every skipped range it stands in (ranges may
    follow one another: a second rollback to the same checkpoint starts where the first ended)."""
    moved = True
    while moved:
        moved = False
        for entry in rollbacks:
            if entry["start"] <= samples_seen < entry["end"]:
                samples_seen, moved = entry["end"], True
    return samples_seen


def summary(entry: dict) -> str:
    """One rollback in words: the spike's step, the checkpoint's, the samples skipped."""
    n = entry["end"] - entry["start"]
    return (f"step {entry.get('step')} -> checkpoint step {entry.get('checkpoint_step')}, samples "
            f"{entry['start']:,}-{entry['end'] - 1:,} skipped ({n:,})")
