"""Start process trees and stop them completely (psutil), so no worker outlives the launcher."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from typing import Callable

import psutil


def start(argv: list[str], env: dict[str, str], log_path: str, on_line: Callable[[str], None] | None = None,
          cwd: str | None = None, stdin_pipe: bool = False) -> subprocess.Popen:
    """Run argv in its own session (a terminal's Ctrl-C reaches only the launcher, which then stops the tree in
    order); its output goes to log_path and, line by line, to on_line."""
    full_env = dict(os.environ)
    full_env.update(env)
    stdin = subprocess.PIPE if stdin_pipe else subprocess.DEVNULL
    proc = subprocess.Popen(argv, env=full_env, cwd=cwd, stdin=stdin, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True, text=True, bufsize=1)

    def pump() -> None:
        with open(log_path, "a", buffering=1) as log:
            for line in proc.stdout:
                log.write(line)
                if on_line is not None:
                    on_line(line)

    threading.Thread(target=pump, daemon=True).start()
    return proc


def tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root] + root.children(recursive=True)
    except psutil.NoSuchProcess:
        return []


WORKER_MODULES = ("llmtrain.worker", "llmtrain.doctor_worker")


def is_worker(p: psutil.Process) -> bool:
    """A torchrun worker: `python -u -m llmtrain.worker ...`, not the agent whose argv also names the module."""
    try:
        argv = p.cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False
    if "torch.distributed.run" in argv or "llmtrain.launch.node_agent" in argv:
        return False
    return any(argv[i] == "-m" and argv[i + 1] in WORKER_MODULES for i in range(len(argv) - 1))


def signal_workers(pid: int, sig: int) -> int:
    """Send sig to the worker processes in pid's tree (never to torchrun agents: SIGUSR1 would kill them)."""
    sent = 0
    for p in tree(pid):
        if is_worker(p):
            try:
                p.send_signal(sig)
                sent += 1
            except psutil.NoSuchProcess:
                continue
    return sent


def stop_tree(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """SIGTERM the whole tree (torchrun forwards it to workers), wait, then SIGKILL whatever is left."""
    procs = tree(proc.pid)
    try:
        pgid = os.getpgid(proc.pid)
    except ProcessLookupError:
        pgid = None
    for p in procs:
        try:
            p.send_signal(signal.SIGTERM)
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    # Children may have been re-parented before we listed them: the process group catches those.
    if pgid is not None:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=5)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass
