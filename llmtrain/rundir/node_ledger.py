"""RUN_DIR/nodes.json, a run directory's record of what went wrong on which host, across launches and requeues.

Per host: a count per kind of event and its last few events. The kinds:
- "failure": a rank of that host failed (the culprit, as launch/supervision/failures.py names it);
- "startup": the host failed before any rank of the start ran (a set-up line, the node agent, a missing module);
- "hang": a rank of that host stopped responding;
- "straggler": a rank of that host was judged slow.
Beside the hosts, the Slurm job's record of its starts (whether each saved a checkpoint), the hosts its requeue
excludes, and why it stopped, when it stopped itself.

Several processes may write it (each node's launcher, the job's end, a hang detector): every change is a
read-modify-write under an flock on RUN_DIR/nodes.json.lock, and the file is replaced atomically, so a reader
never sees half of it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Callable, Iterator

from llmtrain.rundir.atomic import atomic_write_text
from llmtrain.rundir.paths import RunPaths
from llmtrain.rundir.unwritten import warn_unwritten

KINDS = ("failure", "startup", "hang", "straggler")
EVENTS_KEPT = 5  # per host: enough to tell a pattern, small enough to read


def ledger_path(run_dir: str) -> str:
    return RunPaths(run_dir).nodes


def empty_ledger() -> dict:
    return {"hosts": {}, "starts": {}, "excluded": {}, "stopped": None}


def now_text() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def read_ledger(run_dir: str) -> dict:
    """The ledger, or an empty one when there is none (or it cannot be read: it is advice, never a blocker)."""
    try:
        with open(ledger_path(run_dir)) as f:
            found = json.load(f)
    except (OSError, ValueError):
        return empty_ledger()
    return {**empty_ledger(), **found} if isinstance(found, dict) else empty_ledger()


@contextlib.contextmanager
def _locked(run_dir: str) -> Iterator[None]:
    with open(ledger_path(run_dir) + ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def update_ledger(run_dir: str, change: Callable[[dict], None]) -> dict:
    """Apply `change` to the ledger in place, under the lock, and write it back atomically; returns the result.
    A ledger that cannot be written (a full disk) is one warning: it is advice, and its writers are on their way
    to report a failure."""
    ledger = read_ledger(run_dir)
    try:
        os.makedirs(run_dir, exist_ok=True)
        with _locked(run_dir):
            ledger = read_ledger(run_dir)
            change(ledger)
            atomic_write_text(ledger_path(run_dir), json.dumps(ledger, indent=1, sort_keys=True) + "\n")
    except OSError as e:
        warn_unwritten(ledger_path(run_dir), e)
    return ledger


def add_event(ledger: dict, host: str, kind: str, detail: str, job: str | None = None) -> None:
    """Count one event of `kind` on `host` and keep it among the host's last EVENTS_KEPT events."""
    if kind not in KINDS:
        raise ValueError(f"unknown node event kind {kind!r}; one of {', '.join(KINDS)}")
    entry = ledger["hosts"].setdefault(host, {})
    for k in KINDS:
        entry.setdefault(k, 0)
    entry[kind] += 1
    event = {"time": now_text(), "kind": kind, "detail": detail}
    if job:
        event["job"] = job
    entry["last"] = (entry.get("last", []) + [event])[-EVENTS_KEPT:]


def record_node_event(run_dir: str, host: str, kind: str, detail: str, job: str | None = None) -> dict:
    """Record that `kind` ("failure", "startup", "hang", "straggler") happened on `host`, with a one-line detail
    (`rank 1 exited 1`); returns the ledger as written."""
    return update_ledger(run_dir, lambda ledger: add_event(ledger, host, kind, detail, job))


def last_detail(entry: dict, kinds: tuple[str, ...]) -> str:
    """The newest event's detail among `kinds` of a host's entry, or ''."""
    found = [e for e in entry.get("last", []) if e.get("kind") in kinds]
    return found[-1].get("detail", "") if found else ""
