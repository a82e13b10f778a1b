"""RUN_DIR/logs/combined.log: every rank's log in one file, each line prefixed `[node/rank]`, and a separator with
the time and the launch number whenever the run is launched again (or its Slurm job requeued).

The per-rank logs stay as they are (each rank writes its own, so no two writers share a file); the combined log is
written by whoever follows the job: the launcher as it polls (local, ssh), and for Slurm a merger the batch script
runs next to srun (`python -m llmtrain.launch.supervision.combined_log RUN_DIR`, stopped with SIGTERM after a last read).
Lines from different ranks are in the order they were read, which is their order to within a poll.
"""

from __future__ import annotations

import glob
import os
import re
import signal
import sys
import threading
import time

from llmtrain.rundir.job_record import read_launches
from llmtrain.launch.supervision.line_follower import LineFollower
from llmtrain.launch.supervision.placement import read_places
from llmtrain.rundir.paths import RunPaths

POLL_S = 1.0
_RANK_LOG = re.compile(r"rank(\d+)\.log$")


def combined_path(run_dir: str) -> str:
    return RunPaths(run_dir).combined_log


def launch_header(run_dir: str) -> str:
    """`launch 3`, plus the Slurm job and its restart when this runs inside one."""
    header = f"launch {max(1, len(read_launches(run_dir)))}"
    job = os.environ.get("SLURM_JOB_ID")
    if job:
        header += f" (Slurm job {job}, restart {os.environ.get('SLURM_RESTART_COUNT', '0')})"
    return header


class CombinedLog:
    def __init__(self, run_dir: str, header: str | None = None):
        self.run_dir = run_dir
        self.logs = RunPaths(run_dir).logs
        os.makedirs(self.logs, exist_ok=True)
        # Rank logs are appended to by every launch: only what this launch adds is new.
        self.followers = {path: LineFollower(path, from_end=True) for path in self._rank_logs()}
        self.nodes: dict[int, int] = {}
        stamp = time.strftime("%Y-%m-%d %H:%M:%S %Z")
        self._write([f"===== {header or launch_header(run_dir)}, {stamp} ====="])

    def _rank_logs(self) -> list[str]:
        return glob.glob(RunPaths(self.run_dir).rank_log("*"))

    def _node(self, rank: int) -> str:
        if rank not in self.nodes:
            node = read_places(self.run_dir).get(rank, {}).get("node")
            if node is None:
                return "?"  # not recorded yet: asked again at the next line
            self.nodes[rank] = node
        return str(self.nodes[rank])

    def poll(self) -> None:
        out = []
        for path in sorted(self._rank_logs()):
            match = _RANK_LOG.search(path)
            if not match:
                continue
            follower = self.followers.setdefault(path, LineFollower(path))
            lines = follower.new_lines()
            if lines:
                rank = int(match.group(1))
                prefix = f"[{self._node(rank)}/{rank}] "
                out += [prefix + line for line in lines]
        self._write(out)

    def _write(self, lines: list[str]) -> None:
        if not lines:
            return
        try:
            with open(combined_path(self.run_dir), "a") as f:
                f.write("\n".join(lines) + "\n")
        except OSError:  # a full disk must not stop the job being followed
            pass


def main(argv: list[str] | None = None) -> int:
    """The Slurm batch script's merger: poll until SIGTERM, then read what is left and exit."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m llmtrain.launch.supervision.combined_log RUN_DIR", file=sys.stderr)
        return 2
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    log = CombinedLog(argv[0])
    while not stop.wait(POLL_S):
        log.poll()
    log.poll()
    return 0


if __name__ == "__main__":
    sys.exit(main())
