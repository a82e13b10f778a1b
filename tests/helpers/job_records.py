"""Job records and job commands for the job tests: a launch entry of job.json, a good rank status, the CLI in-process."""

from __future__ import annotations

import socket

from llmtrain.cli import main


def launch_entry(n: int = 1, backend: str = "local", exit_code: int | None = 0, ended: str | None = "later",
                 job_id: str | None = None) -> dict:
    return {"launch": n, "backend": backend, "launcher": {"host": socket.gethostname(), "pid": 1},
            "job_id": job_id, "hosts": [socket.gethostname()] if backend == "local" else None,
            "started": "2025-01-01 10:00:00", "overrides": ["train.max_steps=4"], "ended": ended,
            "exit_code": exit_code}


OK = {"status": "ok", "error": None}


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err
