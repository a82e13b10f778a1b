"""RUN_DIR/trackers.json: the tracker run ids of this run ({"wandb": id, "mlflow": id}), so a resumed run logs
to the same tracker runs."""

from __future__ import annotations

import json

from llmtrain.rundir.atomic import atomic_write_json
from llmtrain.rundir.paths import TRACKERS, RunPaths

FILE = TRACKERS


def read_run_ids(run_dir: str) -> dict[str, str]:
    try:
        with open(RunPaths(run_dir).trackers) as f:
            ids = json.load(f)
    except (FileNotFoundError, ValueError):
        return {}
    return {k: v for k, v in ids.items() if isinstance(v, str)} if isinstance(ids, dict) else {}


def write_run_ids(run_dir: str, ids: dict[str, str]) -> None:
    """Written whole or not at all: a launch killed mid-write leaves the previous file."""
    atomic_write_json(RunPaths(run_dir).trackers, ids, indent=1, sort_keys=True)
