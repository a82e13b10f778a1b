"""The node agent's part of a hang's evidence: when the launcher names a folder in RUN_DIR/hangs/request, signal
this node's workers for their stacks and collective traces (SIGUSR2, see train/hang_signals.py), add py-spy's view
when it is installed, copy their last log lines, and say what was done in node{N}.json. The files go through the
run directory, which every node shares, so this works the same under the local, ssh and Slurm backends."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from typing import Callable

import psutil

from llmtrain.launch.supervision.failures import tail
from llmtrain.rundir.paths import RunPaths
from llmtrain.launch.supervision.processes import handles_signal
from llmtrain.rundir.hang_files import node_answer_path, requested_folder, write_json

DUMP_SIGNAL = signal.SIGUSR2
ANSWER_WAIT_S = 5.0  # for the workers' own files; a rank that has not written them by then will not
LOG_LINES = 30


class HangRequests:
    def __init__(self, run_dir: str, node_rank: int, workers: Callable[[], list[psutil.Process]]):
        self.run_dir, self.node_rank, self.workers = run_dir, node_rank, workers
        self.answered = requested_folder(run_dir)  # a request from an earlier launch is not this one's

    def poll(self) -> None:
        folder = requested_folder(self.run_dir)
        if folder is None or folder == self.answered or not os.path.isdir(folder):
            return
        self.answered = folder
        try:
            self._answer(folder)
        except OSError as e:  # the agent must go on supervising its node whatever the evidence costs
            print(f"llmtrain: node {self.node_rank}: could not write hang evidence to {folder}: {e}", flush=True)

    def _answer(self, folder: str) -> None:
        ranks = {}
        for p in self.workers():
            rank, state = _rank_of(p), _state(p)
            if rank is None:
                continue
            ranks[rank] = {"pid": p.pid, "state": state, "signalled": False}
            if state != psutil.STATUS_STOPPED and handles_signal(p.pid, DUMP_SIGNAL):
                try:
                    p.send_signal(DUMP_SIGNAL)
                    ranks[rank]["signalled"] = True
                except psutil.NoSuchProcess:
                    ranks[rank]["state"] = "gone"
        deadline = time.monotonic() + ANSWER_WAIT_S
        while time.monotonic() < deadline and not all(
                os.path.exists(os.path.join(folder, f"rank{r}.collectives.json"))
                for r, info in ranks.items() if info["signalled"]):
            time.sleep(0.1)
        for rank, info in ranks.items():
            info["answered"] = os.path.exists(os.path.join(folder, f"rank{rank}.collectives.json"))
            with open(os.path.join(folder, f"rank{rank}.log.txt"), "w") as f:
                f.writelines(line + "\n" for line in tail(RunPaths(self.run_dir).rank_log(rank),
                                                          LOG_LINES))
            _py_spy(info["pid"], os.path.join(folder, f"rank{rank}.py-spy.txt"))
        write_json(node_answer_path(folder, self.node_rank),
                   {"node": self.node_rank, "host": socket.gethostname(), "ranks": ranks})


def _rank_of(p: psutil.Process) -> int | None:
    try:
        return int(p.environ()["RANK"])
    except (psutil.Error, KeyError, ValueError):
        return None


def _state(p: psutil.Process) -> str:
    try:
        return p.status()
    except psutil.NoSuchProcess:
        return "gone"
    except psutil.Error:
        return "unknown"


def _py_spy(pid: int, path: str) -> None:
    """py-spy's dump (native frames too) when it is on PATH; it reads a stopped process as well."""
    exe = shutil.which("py-spy")
    if exe is None:
        return
    try:
        out = subprocess.run([exe, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return
    with open(path, "w") as f:
        f.write(out.stdout + out.stderr)
