"""Runs on each node under ssh or srun: `python -m llmtrain.launch.node.agent RUN_DIR NODE_RANK|BACKEND -- CMD...`.

It starts CMD (torchrun) in its own session and ties it to its controller:
- stdin closing (the launcher died, was stopped, or the ssh connection dropped) stops the whole tree, so no
  process is left on the node; a line "preempt" asks the workers to checkpoint (SIGUSR1);
- with HEARTBEAT_ENV set (ssh), the launcher writes a line every that many seconds; silence for HEARTBEAT_MISSES of
  them means the head node is unreachable (a network partition never closes stdin) and stops the tree too;
- the agent's own death (kill -9) takes torchrun with it (PR_SET_PDEATHSIG), so its workers stop, their peers
  fail, and the job ends as for a lost worker instead of training on unsupervised;
- SIGTERM / SIGUSR1 to the agent (Slurm preemption or time limit) are passed to the workers as SIGUSR1;
- the effective environment is recorded in RUN_DIR/logs/node{N}.env;
- a hang's evidence the launcher asks for is gathered from this node's workers (hang_evidence.py).
It exits with CMD's exit status.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time

from llmtrain.launch.backends.traits import known_traits
from llmtrain.launch.supervision.placement import NODE_INDEX_ENV
from llmtrain.rundir.paths import RunPaths

HEARTBEAT_ENV = "LLMTRAIN_AGENT_HEARTBEAT_S"
HEARTBEAT_MISSES = 6
PR_SET_PDEATHSIG = 1

# Variables worth recording: they decide how collectives reach the other nodes.
RECORDED_PREFIXES = ("NCCL_", "GLOO_", "CUDA_", "TORCH_", "OMP_", "MASTER_", "SLURM_", "LLMTRAIN_", "UCX_",
                     "FI_", "PYTHONPATH", "LD_LIBRARY_PATH", "HOSTNAME")


def record_env(run_dir: str, node_rank: int) -> None:
    path = RunPaths(run_dir).node_env(node_rank)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    lines = [f"{k}={v}\n" for k, v in sorted(os.environ.items()) if k.startswith(RECORDED_PREFIXES)]
    lines.insert(0, f"# node {node_rank} host {os.uname().nodename}\n")
    with open(path, "w") as f:
        f.writelines(lines)


def _child_setup() -> None:
    """In torchrun before exec: ignore SIGUSR1 (see main), and die with the agent."""
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):  # not Linux: the stdin watch still covers a lost launcher
        pass


def node_rank_of(arg: str) -> int:
    """NODE_RANK, or a backend whose scheduler starts the same command on every node (srun): the node rank is then
    in the environment variable its traits name (node_rank_env)."""
    traits = known_traits(arg)
    env = traits.node_rank_env if traits is not None else None
    return int(os.environ[env]) if env else int(arg)


def main(argv: list[str] | None = None) -> int:
    import psutil

    from llmtrain.launch.node.hang_evidence import HangRequests
    from llmtrain.launch.supervision import processes
    from llmtrain.launch.supervision.processes import handles_signal, is_worker

    argv = sys.argv[1:] if argv is None else argv
    if "--" not in argv or argv.index("--") != 2:
        print("usage: python -m llmtrain.launch.node.agent RUN_DIR NODE_RANK -- CMD...", file=sys.stderr)
        return 2
    # A preemption (Slurm's time-limit notice) may come before torchrun's workers exist or can take it: remember
    # it from the first moment and pass it on once they can.
    pending = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGUSR1):
        signal.signal(sig, lambda *_: pending.set())
    run_dir, cmd = argv[0], argv[3:]
    node_rank = node_rank_of(argv[1])
    record_env(run_dir, node_rank)
    # torchrun must outlive SIGUSR1 (Slurm signals every process of the step): the workers handle it, the agent
    # would die of it. Workers install their own handler over the inherited SIG_IGN.
    child = subprocess.Popen(cmd, start_new_session=True, preexec_fn=_child_setup,
                             env={**os.environ, NODE_INDEX_ENV: str(node_rank)})
    stopping = threading.Event()

    def workers() -> list:
        try:
            procs = psutil.Process(child.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []
        return [p for p in procs if is_worker(p)]

    def preempt(*_) -> None:
        pending.set()
        deliver()

    def deliver() -> None:
        """SIGUSR1 to the workers once every one has its handler (until then it would be ignored, or kill)."""
        ready = workers()
        if not ready or any(handles_signal(p.pid, signal.SIGUSR1) is False for p in ready):
            return
        for p in ready:
            try:
                p.send_signal(signal.SIGUSR1)
            except psutil.NoSuchProcess:
                pass
        pending.clear()

    def stop_tree() -> None:
        if not stopping.is_set():
            stopping.set()
            processes.stop_tree(child, grace_s=10.0)  # torchrun has a session of its own: its group goes too

    hang_requests = HangRequests(run_dir, node_rank, workers)
    heartbeat_s = float(os.environ.get(HEARTBEAT_ENV) or 0)
    last_word = [time.monotonic()]

    def watch_stdin() -> None:
        for line in sys.stdin:
            last_word[0] = time.monotonic()
            if line.strip() == "preempt":
                preempt()
            elif line.strip() == "stop":
                break
        if child.poll() is None:
            stop_tree()

    signal.signal(signal.SIGTERM, preempt)
    signal.signal(signal.SIGUSR1, preempt)
    if not sys.stdin.isatty() and os.environ.get("LLMTRAIN_AGENT_WATCH_STDIN", "1") == "1":
        threading.Thread(target=watch_stdin, daemon=True).start()
    while True:
        try:
            return child.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            if pending.is_set():
                deliver()
            hang_requests.poll()
            silent = time.monotonic() - last_word[0]
            if heartbeat_s and silent > heartbeat_s * HEARTBEAT_MISSES and not stopping.is_set():
                print(f"llmtrain: node {node_rank}: no word from the launcher for {silent:.0f} s (head node "
                      "unreachable?); stopping this node's processes", file=sys.stderr, flush=True)
                stop_tree()
        except KeyboardInterrupt:
            stop_tree()


if __name__ == "__main__":
    sys.exit(main())
