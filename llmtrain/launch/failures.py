"""Which rank, and which node, failed: from torchrun's failure summaries and the ranks' status files.

When one rank dies, its peers fail too (a reset connection, a collective timeout) and record an error, and under
load torchrun, or the launcher, may see one of those first. The culprit is the rank that died without a word: killed
by a signal, or gone without writing its status file.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass

from rich.console import Console

# One entry of torchrun's "Failures:" / "Root Cause" summary (time, host and local_rank are optional).
_FAILURE = re.compile(r"(?:time\s*:\s*(\S+)\s*\n\s*)?(?:host\s*:\s*(\S+)\s*\n\s*)?"
                      r"rank\s*:\s*(\d+)(?:\s*\(local_rank:\s*(\d+)\))?[^\n]*\n\s*exitcode\s*:\s*(-?\d+)")
SIGTERM = 15  # what launchers (srun, torchrun, ours) send to stop the survivors
SSH_ERROR = 255  # ssh's own failure: the connection or the host went away


@dataclass(frozen=True)
class RankFailure:
    rank: int
    code: int  # negative: killed by that signal
    local_rank: int | None = None
    host: str | None = None
    time: str = ""  # torchrun's YYYY-MM-DD_HH:MM:SS


def _death_order(f: RankFailure) -> tuple:
    """Silent deaths, earliest first; in the same second, a SIGTERM (a launcher stopping survivors) last."""
    return f.time, f.code == -SIGTERM, f.rank


def agent_failures(agent_output: str) -> dict[int, RankFailure]:
    """rank -> its failure, for every failure in torchrun's summary."""
    return {int(rank): RankFailure(int(rank), int(code), int(local) if local else None, host or None, time)
            for time, host, rank, local, code in _FAILURE.findall(agent_output)}


def rank_statuses(run_dir: str) -> dict[int, dict]:
    logs = os.path.join(run_dir, "logs")
    out = {}
    try:
        names = os.listdir(logs)
    except FileNotFoundError:
        return out
    for name in names:
        if name.startswith("rank") and name.endswith(".status"):
            try:
                with open(os.path.join(logs, name)) as f:
                    out[int(name[4:-7])] = json.load(f)
            except (OSError, ValueError):
                continue
    return out


def _silent(failure: RankFailure, statuses: dict[int, dict]) -> bool:
    return failure.code < 0 or failure.rank not in statuses


def failed_ranks(run_dir: str, agent_output: str) -> list[int]:
    """Failed ranks, the likely culprit first: silent deaths, then torchrun's root cause, then the rest."""
    return _ordered(agent_failures(agent_output), rank_statuses(run_dir), agent_output)


def _ordered(failures: dict[int, RankFailure], statuses: dict[int, dict], agent_output: str) -> list[int]:
    root = agent_output.split("Root Cause", 1)
    root_rank = [int(m[2]) for m in _FAILURE.findall(root[1])[:1]] if len(root) == 2 else []
    errored = sorted(r for r, st in statuses.items() if st.get("status") == "error")
    silent = [f.rank for f in sorted(failures.values(), key=_death_order) if _silent(f, statuses)]
    ordered: list[int] = []
    for r in silent + root_rank + sorted(failures) + errored:
        if r not in ordered:
            ordered.append(r)
    return ordered


def culprit_node(run_dir: str, outputs: list[str], exit_codes: list[int | None], failure_order: list[int]) -> int:
    """Of several nodes' agents (outputs and exit codes by node index), the one whose failure came first in
    cause: a node with a silent rank death, or whose ssh connection broke, before nodes whose ranks only errored;
    among equals, the one that failed first (failure_order lists every failed node, first failure first)."""
    statuses = rank_statuses(run_dir)
    failed = [n for n in failure_order if exit_codes[n] not in (None, 0)]

    def tier(node: int) -> int:
        failures = agent_failures(outputs[node])
        if any(_silent(f, statuses) for f in failures.values()):
            return 0
        return 0 if exit_codes[node] == SSH_ERROR and not failures else 1

    return min(failed, key=lambda n: (tier(n), failed.index(n)))


def tail(path: str, n: int = 20) -> list[str]:
    try:
        with open(path, errors="replace") as f:
            return f.read().splitlines()[-n:]
    except FileNotFoundError:
        return []


def report_failure(console: Console, run_dir: str, agent_output: str, exit_code: int,
                   node: int | None = None) -> None:
    """Name the culprit rank (and its node: `node` when the caller knows it, else the host torchrun reported)
    and print the tail of its log."""
    failures, statuses = agent_failures(agent_output), rank_statuses(run_dir)
    ranks = _ordered(failures, statuses, agent_output)
    if not ranks:
        console.print(f"[bold red]llmtrain: the job failed with exit code {exit_code}[/] (no rank reported an "
                      f"error; see {os.path.join(run_dir, 'logs')})")
        return
    rank = ranks[0]
    failure = failures.get(rank)
    status = statuses.get(rank, {})
    if failure is None:
        how = f"job exit code {exit_code}"
    else:
        how = f"signal {-failure.code}" if failure.code < 0 else f"exit code {failure.code}"
    where = [f"node {node}"] if node is not None else []
    host = (failure.host if failure else None) or status.get("host")
    if host and node is None:
        where.append(f"host {host}")
    if failure is not None and failure.local_rank is not None:
        where.append(f"local rank {failure.local_rank}")
    label = f" ({', '.join(where)})" if where else ""
    log = os.path.join(run_dir, "logs", f"rank{rank}.log")
    console.print(f"[bold red]llmtrain: rank {rank}{label} failed ({how})[/]; last lines of {log}:")
    for line in tail(log):
        console.print(f"  {line}", markup=False, highlight=False)
