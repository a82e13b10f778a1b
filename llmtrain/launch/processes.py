"""Start process trees and stop them completely (psutil), so no worker outlives the launcher."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from typing import Callable

import psutil


def start(argv: list[str], env: dict[str, str], log_path: str, on_line: Callable[[str], None] | None = None,
          cwd: str | None = None) -> subprocess.Popen:
    """Run argv in its own session (a terminal's Ctrl-C reaches only the launcher, which then stops the tree in
    order); its output goes to log_path and, line by line, to on_line."""
    full_env = dict(os.environ)
    full_env.update(env)
    proc = subprocess.Popen(argv, env=full_env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
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


def signal_matching(pid: int, needle: str, sig: int) -> int:
    """Send sig to the processes of pid's tree whose command line contains `needle`."""
    sent = 0
    for p in tree(pid):
        try:
            if needle in " ".join(p.cmdline()):
                p.send_signal(sig)
                sent += 1
        except (psutil.NoSuchProcess, psutil.AccessDenied):
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
