"""RUN_DIR/trackers.json: the tracker run ids of this run ({"wandb": id, "mlflow": id}), so a resumed run logs
to the same tracker runs."""

from __future__ import annotations

import json
import os

FILE = "trackers.json"


def read_run_ids(run_dir: str) -> dict[str, str]:
    try:
        with open(os.path.join(run_dir, FILE)) as f:
            ids = json.load(f)
    except (FileNotFoundError, ValueError):
        return {}
    return {k: v for k, v in ids.items() if isinstance(v, str)} if isinstance(ids, dict) else {}


def write_run_ids(run_dir: str, ids: dict[str, str]) -> None:
    """Written whole or not at all: a launch killed mid-write leaves the previous file."""
    path = os.path.join(run_dir, FILE)
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(ids, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
