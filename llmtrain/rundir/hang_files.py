"""The files hang detection passes between the workers, the node agents and the launcher, all in the run dir.

- RUN_DIR/logs/rank{R}.progress: the step a rank last completed, rewritten after every step (the heartbeat);
- RUN_DIR/hangs/request: the evidence folder the launcher asks for (its name, relative to RUN_DIR/hangs);
- RUN_DIR/hangs/<YYYYmmdd-HHMMSS>/: rank{R}.stacks.txt, rank{R}.collectives.json, rank{R}.log.txt (its last
  lines), node{N}.json (what that node's agent did), verdict.txt.
"""

from __future__ import annotations

import json
import os

HANGS = "hangs"
REQUEST = "request"


def progress_path(run_dir: str, rank: int) -> str:
    return os.path.join(run_dir, "logs", f"rank{rank}.progress")


def request_path(run_dir: str) -> str:
    return os.path.join(run_dir, HANGS, REQUEST)


def write_json(path: str, data: dict) -> None:
    """Atomically: a reader on another node sees the old file or the new one, never half of one."""
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def read_json(path: str) -> dict | None:
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def requested_folder(run_dir: str) -> str | None:
    """The evidence folder the launcher asked for last, or None."""
    try:
        with open(request_path(run_dir)) as f:
            name = f.read().strip()
    except OSError:
        return None
    return os.path.join(run_dir, HANGS, name) if name else None


def request_evidence(run_dir: str, name: str) -> str:
    """Create RUN_DIR/hangs/<name>/ and ask every node agent to fill it; return its path."""
    folder = os.path.join(run_dir, HANGS, name)
    os.makedirs(folder, exist_ok=True)
    tmp = f"{request_path(run_dir)}.tmp"
    with open(tmp, "w") as f:
        f.write(name + "\n")
    os.replace(tmp, request_path(run_dir))
    return folder
