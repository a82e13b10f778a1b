"""One job per run directory: RUN_DIR/.lock names its holder (host, launcher pid, Slurm job) for the job's life.

Two launches into one run directory would share config.yaml, checkpoints and metrics.jsonl, so the second is
refused, naming the holder. A lock whose holder is gone (its process ended, its Slurm job finished) is stale and is
taken over, with a message, unless processes of an earlier launch of this run directory still run on this node.
A Slurm job that outlives its launcher keeps the lock under its job id until it ends. A Slurm job also takes the
lock itself when it starts (claim_for_job), so a job script submitted by hand respects it too.
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid

import psutil

from llmtrain.config.errors import ConfigError
from llmtrain.launch.supervision import processes
from llmtrain.slurm import client
from llmtrain.slurm.job_states import ENDED_STATES
from llmtrain.rundir.atomic import atomic_write_json
from llmtrain.rundir.paths import RunPaths


def _process_started(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def slurm_job_state(job_id: str) -> str | None:
    """The job's state, "UNKNOWN" once it has left the controller, None when scontrol is not here to ask."""
    answer = client.show_job(str(job_id), timeout=30)
    return None if answer is None else answer.fields.get("JobState", "UNKNOWN")


def describe(holder: dict) -> str:
    who = f"Slurm job {holder['job']} (submitted from {holder.get('host')})" if holder.get("job") else \
        f"pid {holder.get('pid')} on {holder.get('host')}"
    return f"{who}, since {holder.get('started', '?')}"


def holder_gone(holder: dict) -> str | None:
    """Why the holder is gone (so its lock is stale), or None while it may still be running."""
    if holder.get("job"):
        state = slurm_job_state(holder["job"])
        return f"its job ended ({state})" if state in ENDED_STATES else None
    if holder.get("host") != socket.gethostname():
        return None  # another host's process cannot be checked from here
    started = _process_started(int(holder.get("pid", -1)))
    if started is None or abs(started - holder.get("pid_started", started)) > 1.0:
        return "its process is gone"
    return None


class RunDirLock:
    def __init__(self, run_dir: str):
        self.run_dir = run_dir
        self.path = RunPaths(run_dir).lock
        self.token = uuid.uuid4().hex
        self.held = False

    def _record(self, job: str | None = None) -> dict:
        return {"host": socket.gethostname(), "pid": os.getpid(), "pid_started": _process_started(os.getpid()),
                "job": job, "started": time.strftime("%Y-%m-%d %H:%M:%S"), "token": self.token}

    def _read(self) -> dict:
        try:
            with open(self.path) as f:
                return json.load(f)
        except FileNotFoundError:
            return {}
        except (OSError, ValueError):
            return {"host": "?", "pid": -1}  # unreadable: treated as a holder whose process is gone

    def acquire(self) -> str | None:
        """Take the lock; return a message when a stale one was taken over. Raises ConfigError when held."""
        os.makedirs(self.run_dir, exist_ok=True)
        note = None
        for _ in range(5):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                holder = self._read()
                if not holder:
                    continue  # released in between: try again
                why = holder_gone(holder)
                if why is None:
                    raise ConfigError("run.dir", f"{self.run_dir} is in use by {describe(holder)}; wait for it to "
                                                 "end, stop it, or use another run.dir (remove "
                                                 f"{self.path} only if that job is gone)") from None
                # Not this process's own children: they belong to this launch (or to a caller such as a test).
                leftovers = processes.job_processes(self.run_dir, descendants=False)
                if leftovers:
                    pids = ", ".join(str(p.pid) for p in leftovers[:5])
                    raise ConfigError("run.dir", f"processes of an earlier launch of {self.run_dir} still run on "
                                                 f"this node (pids {pids}); wait for them to exit or kill them")
                try:  # one launcher wins the stale lock: the rename succeeds for one of them only
                    os.rename(self.path, f"{self.path}.stale-{self.token}")
                    os.remove(f"{self.path}.stale-{self.token}")
                except FileNotFoundError:
                    continue
                note = f"took over the lock of {describe(holder)}: {why}"
                continue
            with os.fdopen(fd, "w") as f:
                json.dump(self._record(), f)
            self.held = True
            return note
        raise ConfigError("run.dir", f"could not take the lock {self.path}: other launches keep taking it")

    def name_job(self, job_id: str) -> None:
        """The Slurm job this launcher submitted, named in the lock at once, so the job knows the lock is its own
        when it starts (claim_for_job) and `llmtrain status` finds it; the launcher still holds the lock."""
        self._write(self._record(job=str(job_id)))

    def _write(self, record: dict) -> None:
        atomic_write_json(self.path, record)

    def hand_to_job(self, job_id: str) -> None:
        """The Slurm job holds the run directory after this launcher exits."""
        self._write(self._record(job=str(job_id)))
        self.held = False

    def release(self) -> None:
        if self.held and self._read().get("token") == self.token:
            try:
                os.remove(self.path)
            except FileNotFoundError:
                pass
        self.held = False


def claim_for_job(run_dir: str, job_id: str, wait_s: float = 30.0) -> None:
    """A Slurm job's start takes the run directory, however the job was submitted (launch, or sbatch of its script
    by hand). The job runs when the lock names it (its launcher named it; or an earlier start of this same job,
    requeued), or once it took a free or stale lock. A launcher holding the lock without a job yet may be the one
    that submitted this job and not have named it: it gets wait_s to do so. Raises ConfigError (run.dir) when
    another job or launcher holds the directory."""
    lock = RunDirLock(run_dir)
    deadline = time.monotonic() + wait_s
    while True:
        holder = lock._read()
        if holder.get("job") == str(job_id):
            return
        if not holder or holder.get("job") or time.monotonic() >= deadline:
            break
        time.sleep(0.5)
    lock.acquire()
    lock.hand_to_job(job_id)
