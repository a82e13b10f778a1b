"""RUN_DIR/job.json: {"launches": [entry, ...]}, one entry per launch into the run directory, oldest first
(written by llmtrain.launch.launch_record, read by `llmtrain status`). The file is rewritten whole and atomically."""

from __future__ import annotations

from llmtrain.rundir.atomic import atomic_write_json
from llmtrain.rundir.json_list import read_entries
from llmtrain.rundir.paths import RunPaths


def read_launches(run_dir: str) -> list[dict]:
    """Every launch recorded in run_dir, oldest first; [] when there is no (readable) record."""
    return read_entries(RunPaths(run_dir).job_record, "launches")


def write_launches(run_dir: str, launches: list[dict]) -> None:
    """Replace the record; OSError (a full disk) leaves it as it was."""
    atomic_write_json(RunPaths(run_dir).job_record, {"launches": launches}, indent=1)
