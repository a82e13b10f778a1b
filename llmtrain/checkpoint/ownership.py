"""A checkpoint location holds one run. RUN_DIR/checkpoints belongs to its run directory by where it is; a location
named by checkpoint.dir or checkpoint.local_dir could be given to two runs (one team config for all), which would
then resume, prune and remove each other's checkpoints. So each such location names its run in a small file,
written by the run's first launch, and another run is refused there in one line."""

from __future__ import annotations

import json

from llmtrain.checkpoint.storage import storage_for

OWNER = ".llmtrain-run"  # {"run_dir": absolute run.dir}


def owner_of(location: str) -> str | None:
    """The run directory whose checkpoints `location` holds; None when no run has claimed it."""
    storage = storage_for(location)
    try:
        return json.loads(storage.read_bytes(storage.join(location, OWNER))).get("run_dir")
    except (FileNotFoundError, ValueError, AttributeError):
        return None


def other_run(location: str, run_dir: str) -> str | None:
    """Why `run_dir` may not keep checkpoints at `location`, or None."""
    owner = owner_of(location)
    if owner is None or owner == run_dir:
        return None
    return (f"{location} holds the checkpoints of the run in {owner}; give this run its own location (e.g. "
            f"{location.rstrip('/')}-2), or resume from one of them with checkpoint.resume=PATH and another "
            f"location; if {owner} moved to {run_dir}, remove {storage_for(location).join(location, OWNER)}")


def claim(location: str, run_dir: str) -> None:
    """Name `run_dir` as the run whose checkpoints `location` holds (once, by its first launch)."""
    if owner_of(location) != run_dir:
        storage = storage_for(location)
        storage.makedirs(location)
        storage.write_bytes(storage.join(location, OWNER), json.dumps({"run_dir": run_dir}).encode())
