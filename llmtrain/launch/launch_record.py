"""RUN_DIR/job.json: what each launch into a run directory started, written by the launcher.

One entry per launch, oldest first, so `llmtrain status` can show the history: the backend, the launcher's host
and pid, the Slurm job id (once sbatch gave one), the hosts, the start time, the overrides, what checkpoint.resume
resolved to (the checkpoint the workers' first start loads), and how the launcher ended; a Slurm job adds why it
stopped requeueing and the nodes its requeue excludes. The file is rewritten whole and atomically, by whoever holds
RUN_DIR/.lock: the launcher, or the Slurm job it submitted.
"""

from __future__ import annotations

import os
import socket
import sys
import time

from llmtrain.launch.backends.traits import known_traits
from llmtrain.rundir import space_reserve
from llmtrain.rundir.job_record import read_launches, write_launches
from llmtrain.rundir.paths import RunPaths
from llmtrain.rundir.unwritten import warn_unwritten


def newest_launch(run_dir: str) -> dict:
    """The newest launch's entry; {} when there is none."""
    launches = read_launches(run_dir)
    return launches[-1] if launches else {}


def _write(run_dir: str, launches: list[dict]) -> None:
    """A failed write (a full disk) leaves the record as it was and must not stop the launch: one warning."""
    try:
        write_launches(run_dir, launches)
    except OSError as e:
        warn_unwritten(RunPaths(run_dir).job_record, e)


def launch_overrides(argv: list[str]) -> list[str]:
    """The overrides of `llmtrain launch [--config-dir DIR] OVERRIDE...` in a command line (argv without the
    program name); [] for any other command."""
    if not argv or argv[0] != "launch":
        return []
    overrides, skip = [], False
    for arg in argv[1:]:
        if skip:
            skip = False
        elif arg == "--config-dir":
            skip = True
        elif not arg.startswith("-"):
            overrides.append(arg)
    return overrides


class LaunchRecord:
    """This launch's entry in job.json."""

    def __init__(self, run_dir: str, entry: dict):
        self.run_dir = run_dir
        self.entry = entry

    @classmethod
    def start(cls, cfg, backend, resume: dict | None = None, batch_origin: str | None = None) -> LaunchRecord:
        """Append this launch to the record, before the backend starts anything. `resume`: what
        checkpoint.resume resolved to (checkpoint/resume.py's Resolution.to_record); `batch_origin`: where
        train.global_batch_size came from (config/batch.py's ORIGIN_WORDS), which the trainer's first line says."""
        run_dir = cfg.run.dir
        earlier = read_launches(run_dir)
        entry = {"launch": len(earlier) + 1, "backend": backend.name,
                 "launcher": {"host": socket.gethostname(), "pid": os.getpid()}, "job_id": None,
                 "hosts": backend.host_names(), "started": time.strftime("%Y-%m-%d %H:%M:%S"),
                 "overrides": launch_overrides(sys.argv[1:]), "resume": resume,
                 "global_batch": {"size": cfg.train.global_batch_size, "origin": batch_origin},
                 "ended": None, "exit_code": None}
        _write(run_dir, earlier + [entry])
        # Room for the exit code, should the job fill the disk (given back in ended()).
        space_reserve.hold(RunPaths(run_dir).launcher_reserve)
        return cls(run_dir, entry)

    def update(self, **facts) -> None:
        """Add facts to this launch's entry (a new start's shape and resume), rewriting the record."""
        self.entry.update(facts)
        launches = read_launches(self.run_dir)
        if launches and launches[-1].get("launch") == self.entry["launch"]:
            launches[-1] = {**launches[-1], **self.entry}
            _write(self.run_dir, launches)

    def ended(self, exit_code: int | None, job_id: str | None) -> None:
        """How the launcher ended (None: with an exception), and the Slurm job id sbatch gave, if any."""
        self.entry.update(job_id=job_id, exit_code=exit_code, ended=time.strftime("%Y-%m-%d %H:%M:%S"))
        launches = read_launches(self.run_dir)
        if launches and launches[-1].get("launch") == self.entry["launch"]:
            # The Slurm job may have added to this entry meanwhile (note_job): kept.
            launches[-1] = {**launches[-1], **self.entry}
        else:  # the record was removed or replaced meanwhile: keep at least this launch
            launches.append(self.entry)
        reserve = RunPaths(self.run_dir).launcher_reserve
        try:
            space_reserve.write_with_room(reserve, lambda: write_launches(self.run_dir, launches))
        except OSError as e:
            warn_unwritten(RunPaths(self.run_dir).job_record, e, f"this launch's exit code {exit_code}")
        finally:
            space_reserve.release(reserve)


def _job_entries(launches: list[dict], job_id: str) -> list[dict]:
    """The entries of the launch that submitted Slurm job `job_id` (the newest launch of a queued backend while its
    launcher has not yet recorded the id)."""
    return [e for e in launches if str(e.get("job_id")) == str(job_id)] or \
        [e for e in launches[-1:] if _queued(e.get("backend")) and e.get("job_id") is None]


def _queued(backend: str | None) -> bool:
    traits = known_traits(backend)  # an unknown name (an old record): not queued
    return traits is not None and traits.queued


def note_job(run_dir: str, job_id: str, **facts) -> None:
    """Add facts to the launch that submitted Slurm job `job_id`: written by the job itself, which holds
    RUN_DIR/.lock while it runs."""
    launches = read_launches(run_dir)
    mine = _job_entries(launches, job_id)
    if mine:
        mine[-1].update(facts)
        _write(run_dir, launches)


def job_launch(run_dir: str, job_id: str) -> dict:
    """The entry of the launch that submitted Slurm job `job_id`; {} when there is none."""
    mine = _job_entries(read_launches(run_dir), job_id)
    return mine[-1] if mine else {}


def batch_origin(entry: dict, global_batch: int) -> str | None:
    """Where a launch's train.global_batch_size came from; None when its entry has no word on it, or one about
    another value (a record left by an earlier launch)."""
    recorded = entry.get("global_batch")
    if isinstance(recorded, dict) and recorded.get("size") == global_batch:
        return recorded.get("origin")
    return None
