"""RUN_DIR/logs/rank{R}.status and rank{R}.place: small JSON files each worker writes about itself, read by the
launcher, `llmtrain status` and the failure reports.

rank{R}.place is written as the worker starts ({"rank", "node", "host", "local_rank", "restart", "pid"}); rank{R}.status
when it ends ({"status": "ok" | "error" | "preempted", "error", "restart", "host", ...}). Both are replaced
whole; an unreadable one counts as not written.
"""

from __future__ import annotations

import contextlib
import json
import os

from llmtrain.rundir.atomic import atomic_write_json
from llmtrain.rundir.paths import PLACE_SUFFIX, STATUS_SUFFIX, RunPaths


def write_status(run_dir: str, rank: int, status: dict) -> None:
    atomic_write_json(RunPaths(run_dir).rank_status(rank), status)


def write_place(run_dir: str, rank: int, place: dict) -> None:
    atomic_write_json(RunPaths(run_dir).rank_place(rank), place)


def read_statuses(run_dir: str) -> dict[int, dict]:
    """rank -> how it ended, for every rank that wrote a readable status."""
    return _read_all(run_dir, STATUS_SUFFIX)


def read_places(run_dir: str) -> dict[int, dict]:
    """rank -> where it runs, for every rank that recorded its place."""
    return _read_all(run_dir, PLACE_SUFFIX)


def status_written_at(run_dir: str, rank: int) -> float | None:
    """When the rank's status was written (a time.time()), None when it has none."""
    try:
        return os.path.getmtime(RunPaths(run_dir).rank_status(rank))
    except OSError:
        return None


def remove_statuses(run_dir: str) -> None:
    """Forget how the ranks of an earlier launch ended, so a launch reads only its own."""
    logs = RunPaths(run_dir).logs
    for name in os.listdir(logs):
        if name.endswith(STATUS_SUFFIX):
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(logs, name))


def _read_all(run_dir: str, suffix: str) -> dict[int, dict]:
    """rank -> the JSON of RUN_DIR/logs/rank{R}{suffix}, for every rank that wrote a readable one."""
    logs = RunPaths(run_dir).logs
    try:
        names = os.listdir(logs)
    except FileNotFoundError:
        return {}
    out = {}
    for name in names:
        rank = name[len("rank"):-len(suffix)]
        if name.startswith("rank") and name.endswith(suffix) and rank.isdigit():
            try:
                with open(os.path.join(logs, name)) as f:
                    out[int(rank)] = json.load(f)
            except (OSError, ValueError):
                continue
    return out
