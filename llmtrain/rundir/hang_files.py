"""The files hang detection passes between the workers, the node agents and the launcher, all in the run dir.

- RUN_DIR/logs/rank{R}.progress: the step a rank last completed, rewritten after every step (the heartbeat);
- RUN_DIR/hangs/request: the evidence folder the launcher asks for (its name, relative to RUN_DIR/hangs);
- RUN_DIR/hangs/<YYYYmmdd-HHMMSS>/: rank{R}.stacks.txt, rank{R}.collectives.json, rank{R}.log.txt (its last
  lines), node{N}.json (what that node's agent did), verdict.txt.
"""

from __future__ import annotations

import json
import os

from llmtrain.rundir.atomic import atomic_write_text
from llmtrain.rundir.paths import RunPaths


def progress_path(run_dir: str, rank: int) -> str:
    return RunPaths(run_dir).rank_progress(rank)


def request_path(run_dir: str) -> str:
    return RunPaths(run_dir).hang_request


def write_json(path: str, data: dict) -> None:
    """Whole: a reader on another node sees the old file or the new one, never half of one. Not flushed to disk:
    the heartbeat is rewritten every step and is worth nothing after a crash."""
    atomic_write_text(path, json.dumps(data), durable=False)


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
    return os.path.join(RunPaths(run_dir).hangs, name) if name else None


def request_evidence(run_dir: str, name: str) -> str:
    """Create RUN_DIR/hangs/<name>/ and ask every node agent to fill it; return its path."""
    folder = os.path.join(RunPaths(run_dir).hangs, name)
    os.makedirs(folder, exist_ok=True)
    atomic_write_text(request_path(run_dir), name + "\n")
    return folder


def node_answer_path(folder: str, node: int) -> str:
    """A node agent's account of what it did for a hang's evidence folder."""
    return os.path.join(folder, f"node{node}.json")


def node_answers(folder: str, nnodes: int) -> dict[int, dict]:
    """node -> its agent's account (node{N}.json), for the nodes that answered."""
    found = {n: read_json(node_answer_path(folder, n)) for n in range(nnodes)}
    return {n: data for n, data in found.items() if data is not None}
