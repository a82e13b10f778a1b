"""torchrun's restarts (launch.max_restarts), told as they happen: which rank died, which restart this is.

On each failure of its worker group torchrun logs the first worker that failed (`failed (exitcode: -9)
local_rank: 1 ...`) in the node's agent log, and restarts the group while it has restarts left. Whether it restarts
is not logged at its default level, so the n-th failure of a node counts as restart n up to launch.max_restarts;
the failure after that is the job's end, which the launcher reports with the rank's log.

torchrun names the first failure it saw in a poll, and a rank that lost its peer (a closed connection) often dies
in the same poll as the peer that was killed. So when the rank it names recorded an error, and another rank of
the attempt ended without recording anything (killed), that silent rank is the one named.
"""

from __future__ import annotations

import glob
import os
import re

from llmtrain.launch.supervision.failures import rank_statuses, storage_error
from llmtrain.launch.supervision.line_follower import LineFollower
from llmtrain.launch.supervision.placement import rank_label, read_places
from llmtrain.rundir.paths import RunPaths

_FAILED = re.compile(r"failed \(exitcode: (-?\d+)\) local_rank: (\d+)")


def describe_exit(code: int) -> str:
    return f"signal {-code}" if code < 0 else f"exit code {code}"


class RestartNotices:
    """Follows every node's agent log (logs/node{N}.log) and turns each restarting failure into one line."""

    def __init__(self, run_dir: str, nnodes: int, max_restarts: int, nproc_per_node: int = 1):
        self.run_dir = run_dir
        self.pattern = RunPaths(run_dir).node_log("*")
        self.nnodes = nnodes
        self.nproc_per_node = nproc_per_node
        self.max_restarts = max_restarts
        # Agent logs are appended to by every launch: only what this launch adds counts.
        self.followers = {path: LineFollower(path, from_end=True) for path in glob.glob(self.pattern)}
        self.failures: dict[str, int] = {}  # log path -> failures seen

    def poll(self) -> list[str]:
        if not self.max_restarts:
            return []
        notices = []
        for path in glob.glob(self.pattern):
            follower = self.followers.setdefault(path, LineFollower(path))
            for line in follower.new_lines():
                failed = _FAILED.search(line)
                if not failed:
                    continue
                number = self.failures[path] = self.failures.get(path, 0) + 1
                if number <= self.max_restarts:
                    notices.append(self._notice(path, int(failed.group(1)), int(failed.group(2)), number))
        return notices

    def _notice(self, path: str, code: int, local_rank: int, number: int) -> str:
        node = os.path.basename(path)[len("node"):-len(".log")]
        how = describe_exit(code)
        silent = self._silent_rank(local_rank, code, attempt=number - 1)
        if silent is not None:
            local_rank, how = silent, "ended without an error of its own: killed"
        who = rank_label(self._global_rank(int(node), local_rank), int(node), self._host(int(node)), local_rank)
        return (f"llmtrain: {who} failed ({how}); torchrun restarts the workers (restart "
                f"{number} of {self.max_restarts}), which resume from the newest complete checkpoint")

    def _global_rank(self, node: int, local_rank: int) -> int | None:
        """The global rank at (node, local rank), as the workers recorded it (c10d rendezvous numbers nodes in the
        order they join, so it cannot be computed); on one node it is the local rank."""
        if self.nnodes == 1:
            return local_rank
        places = read_places(self.run_dir).values()
        return next((p["rank"] for p in places if p.get("node") == node and p.get("local_rank") == local_rank), None)

    def _host(self, node: int) -> str | None:
        return next((p.get("host") for p in read_places(self.run_dir).values() if p.get("node") == node), None)

    def _silent_rank(self, named: int, code: int, attempt: int) -> int | None:
        """On one node: a rank of this attempt with no status, when the named one recorded an error (other than
        a storage error: that one is the cause, and may be why the other could not write its status)."""
        if self.nnodes != 1 or code < 0:
            return None
        statuses = {r: s for r, s in rank_statuses(self.run_dir).items() if s.get("restart") == attempt}
        if statuses.get(named, {}).get("status") != "error" or storage_error(statuses[named]):
            return None
        silent = [r for r in range(self.nproc_per_node) if r not in statuses]
        return silent[0] if silent else None
