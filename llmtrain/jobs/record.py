"""RUN_DIR/job.json: what each launch into a run directory started, written by the launcher.

One entry per launch, oldest first, so `llmtrain status` can show the history: the backend, the launcher's host
and pid, the Slurm job id (once sbatch gave one), the hosts, the start time, the overrides, what checkpoint.resume
resolved to (the checkpoint the workers' first start loads), and how the launcher ended. The file is rewritten
whole and atomically; only the launcher holding RUN_DIR/.lock writes it.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import time

RECORD_NAME = "job.json"


def record_path(run_dir: str) -> str:
    return os.path.join(run_dir, RECORD_NAME)


def read_launches(run_dir: str) -> list[dict]:
    """Every launch recorded in run_dir, oldest first; [] when there is no (readable) record."""
    try:
        with open(record_path(run_dir)) as f:
            launches = json.load(f).get("launches", [])
    except (OSError, ValueError, AttributeError):
        return []
    return [entry for entry in launches if isinstance(entry, dict)]


def newest_launch(run_dir: str) -> dict:
    """The newest launch's entry; {} when there is none."""
    launches = read_launches(run_dir)
    return launches[-1] if launches else {}


def _write(run_dir: str, launches: list[dict]) -> None:
    """Atomically; a failed write (a full disk) leaves the record as it was and must not stop the launch."""
    path = record_path(run_dir)
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w") as f:
            json.dump({"launches": launches}, f, indent=1)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.remove(tmp)


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
    def start(cls, cfg, backend, resume: dict | None = None) -> LaunchRecord:
        """Append this launch to the record, before the backend starts anything. `resume`: what
        checkpoint.resume resolved to (checkpoint/resume.py's Resolution.to_record)."""
        run_dir = cfg.run.dir
        earlier = read_launches(run_dir)
        entry = {"launch": len(earlier) + 1, "backend": backend.name,
                 "launcher": {"host": socket.gethostname(), "pid": os.getpid()}, "job_id": None,
                 "hosts": backend.host_names(), "started": time.strftime("%Y-%m-%d %H:%M:%S"),
                 "overrides": launch_overrides(sys.argv[1:]), "resume": resume, "ended": None, "exit_code": None}
        _write(run_dir, earlier + [entry])
        return cls(run_dir, entry)

    def ended(self, exit_code: int | None, job_id: str | None) -> None:
        """How the launcher ended (None: with an exception), and the Slurm job id sbatch gave, if any."""
        self.entry.update(job_id=job_id, exit_code=exit_code, ended=time.strftime("%Y-%m-%d %H:%M:%S"))
        launches = read_launches(self.run_dir)
        if launches and launches[-1].get("launch") == self.entry["launch"]:
            launches[-1] = self.entry
        else:  # the record was removed or replaced meanwhile: keep at least this launch
            launches.append(self.entry)
        _write(self.run_dir, launches)
