"""The end of a start: its entry in RUN_DIR/goodput.json (llmtrain.rundir.goodput), from rank 0's timeline and the
newest complete checkpoint (what the next start resumes from, for an attempt that did not finish). Called by the
launcher for local and ssh launches, and by a Slurm job's batch script (slurm_job_start / slurm_job_end) for each
start of the job."""

from __future__ import annotations

import contextlib
import json
import os
import time

from llmtrain.checkpoint import store
from llmtrain.launch.launch_record import job_launch, newest_launch
from llmtrain.errors import ObjectStoreError
from llmtrain.rundir.atomic import atomic_write_json
from llmtrain.rundir.paths import RunPaths
from llmtrain.rundir import goodput



def record_start(run_dir: str, started: float, queue_s: float = 0.0, launch: int | None = None,
                 job_id: str | None = None, ended: float | None = None) -> dict:
    try:
        latest, _ = store.latest_complete(run_dir)
    except ObjectStoreError:  # a store that does not answer just now: the start is recorded without its step
        latest = None
    ended = time.time() if ended is None else ended
    entry = goodput.ledger_entry(goodput.read_events(run_dir), started, ended, queue_s=queue_s,
                                 kept_step=latest.step if latest else 0)
    entry = {"launch": launch, "job_id": job_id, "started_at": round(started, 3), "ended_at": round(ended, 3),
             **start_shape(run_dir, job_id), **entry}
    goodput.append_entry(run_dir, entry)
    return entry


def start_shape(run_dir: str, job_id: str | None) -> dict:
    """The start's node count and layout, from its launch's record (launch/shape/start_record.py); {} without."""
    entry = job_launch(run_dir, job_id) if job_id else newest_launch(run_dir)
    starts = entry.get("starts") or []
    return {"nodes": starts[-1].get("nnodes"), "layout": starts[-1].get("layout")} if starts else {}


def slurm_queue_s(run_dir: str, fields: dict[str, str], requeued: bool) -> float:
    """A job's first start: SubmitTime to StartTime of `scontrol show job`; a requeued start: the previous start's
    end (in the ledger) to StartTime, whatever Slurm keeps as SubmitTime. 0 when unknown."""
    def stamp(key: str) -> float | None:
        try:
            return time.mktime(time.strptime(fields.get(key, ""), "%Y-%m-%dT%H:%M:%S"))
        except ValueError:
            return None

    start = stamp("StartTime")
    starts = goodput.read_ledger(run_dir)
    since = starts[-1].get("ended_at") if requeued and starts else stamp("SubmitTime")
    return max(0.0, start - since) if start is not None and isinstance(since, (int, float)) else 0.0


def slurm_start_began(run_dir: str, queue_s: float) -> None:
    """At a Slurm start, before any worker runs: an empty timeline, and when this start began."""
    goodput.clear_events(run_dir)
    path = RunPaths(run_dir).goodput_start
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with contextlib.suppress(OSError):
        atomic_write_json(path, {"started": time.time(), "queue_s": queue_s})


def slurm_start_ended(run_dir: str, job_id: str, ended: float | None = None) -> None:
    """At a Slurm start's end: its ledger entry (nothing when its beginning was not recorded); its beginning goes,
    so that a beginning left behind tells of a start whose end never came."""
    path = RunPaths(run_dir).goodput_start
    try:
        with open(path) as f:
            began = json.load(f)
    except (OSError, ValueError):
        return
    record_start(run_dir, began["started"], queue_s=began.get("queue_s", 0.0), job_id=job_id, ended=ended)
    with contextlib.suppress(OSError):
        os.remove(path)


def close_unended_start(run_dir: str, job_id: str) -> None:
    """At a Slurm start's beginning: the entry of the previous start when its end never came (Slurm requeued the job
    and stopped its batch shell first), ended at its last event."""
    path = RunPaths(run_dir).goodput_start
    if not os.path.exists(path):
        return
    events = goodput.read_events(run_dir)
    with contextlib.suppress(OSError):
        slurm_start_ended(run_dir, job_id, events[-1]["t"] if events else os.path.getmtime(path))
