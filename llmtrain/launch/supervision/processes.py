"""Start process trees and stop them completely (psutil), so no worker outlives the launcher."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
from typing import Callable

import psutil

from llmtrain.rundir.unwritten import warn_unwritten


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
        # A log that cannot be written (a full disk) is said once; the output is still read and handed on, so
        # the process never blocks on a full pipe and its failure summary still reaches the launcher.
        log = None
        with contextlib.suppress(OSError):
            log = open(log_path, "a", buffering=1)
        for line in proc.stdout:
            if log is not None:
                try:
                    log.write(line)
                except OSError as e:
                    warn_unwritten(log_path, e)
                    with contextlib.suppress(OSError):
                        log.close()
                    log = None
            if on_line is not None:
                on_line(line)
        if log is not None:
            with contextlib.suppress(OSError):
                log.close()

    threading.Thread(target=pump, daemon=True).start()
    return proc


def tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root] + root.children(recursive=True)
    except psutil.NoSuchProcess:
        return []


WORKER_MODULES = ("llmtrain.worker", "llmtrain.doctor.rank_probe")


def is_worker(p: psutil.Process) -> bool:
    """A torchrun worker: `python -u -m llmtrain.worker ...`, not the agent whose argv also names the module."""
    try:
        argv = p.cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False
    if "torch.distributed.run" in argv or "llmtrain.launch.node.agent" in argv:
        return False
    return any(argv[i] == "-m" and argv[i + 1] in WORKER_MODULES for i in range(len(argv) - 1))


def handles_signal(pid: int, sig: int) -> bool | None:
    """Whether process pid has a handler for sig (Linux /proc); None when that cannot be told."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    except (OSError, ValueError):
        return None
    return None


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
    # Workers a restart started during the grace were not listed: kill the tree as it is now, too.
    alive = _kill(list({p.pid: p for p in alive + tree(proc.pid)}.values()))
    psutil.wait_procs(alive, timeout=5)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass


def _kill(procs: list[psutil.Process]) -> list[psutil.Process]:
    """SIGKILL each process (works on stopped ones too); return those that were still there to kill."""
    killed = []
    for p in procs:
        try:
            p.kill()
            killed.append(p)
        except psutil.NoSuchProcess:
            continue
    return killed


def job_processes(run_dir: str | None = None, descendants: bool = True) -> list[psutil.Process]:
    """Every process this launcher started (its descendants; descendants=False leaves them out) and, when run_dir
    is given, every torchrun agent, node agent or worker of run_dir on this node: torchrun starts each worker in a
    session of its own, so a worker whose agent is gone is no longer a descendant."""
    me = os.getpid()
    try:
        found = {p.pid: p for p in psutil.Process(me).children(recursive=True)} if descendants else {}
    except psutil.NoSuchProcess:
        found = {}
    if run_dir:
        markers = WORKER_MODULES + ("torch.distributed.run", "llmtrain.launch.node.agent")
        for p in psutil.process_iter(["cmdline"]):
            argv = p.info["cmdline"] or []
            if p.pid != me and run_dir in argv and any(m in argv for m in markers):
                found.setdefault(p.pid, p)
    return list(found.values())


def kill_all(run_dir: str | None = None) -> int:
    """SIGKILL every process of the job at once (see job_processes), wait until they are gone; return how many.
    Twice: an agent may have started a worker while the first round was being killed."""
    killed: set[int] = set()
    for _ in range(2):
        procs = _kill([p for p in job_processes(run_dir) if p.pid not in killed])
        if not procs:
            break
        killed.update(p.pid for p in procs)
        psutil.wait_procs(procs, timeout=5)
    return len(killed)
