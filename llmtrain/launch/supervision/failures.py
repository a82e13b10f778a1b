"""Which rank, and which node, failed: from torchrun's failure summaries and the ranks' status files.

When one rank dies, its peers fail too (a reset connection, a collective timeout) and record an error, and under
load torchrun, or the launcher, may see one of those first. The culprit is the rank that died without a word: killed
by a signal, or gone without writing its status file. A recorded storage error (no space left, a read-only or
failing disk) comes before that: the same disk can keep a peer from writing its own traceback and status, and it
then looks silent.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from rich.console import Console
from rich.markup import escape

from llmtrain.console import plain
from llmtrain.launch.supervision.placement import describe_rank, read_places
from llmtrain.rundir import rank_files
from llmtrain.rundir.paths import RunPaths

# One entry of torchrun's "Failures:" / "Root Cause" summary (time, host and local_rank are optional).
_FAILURE = re.compile(r"(?:time\s*:\s*(\S+)\s*\n\s*)?(?:host\s*:\s*(\S+)\s*\n\s*)?"
                      r"rank\s*:\s*(\d+)(?:\s*\(local_rank:\s*(\d+)\))?[^\n]*\n\s*exitcode\s*:\s*(-?\d+)")
# A recorded error that blames the storage: the checkpoint's "no space left on device writing checkpoint step N",
# OSError's "[Errno 28] No space left on device", a quota, a read-only or failing file system.
_STORAGE_ERROR = re.compile(r"no space left on device|disk quota exceeded|read-only file system|"
                            r"input/output error|\[Errno (?:5|28|30|122)\]", re.IGNORECASE)
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
    """rank -> how it ended (RUN_DIR/logs/rank{R}.status, written by the worker)."""
    return rank_files.read_statuses(run_dir)


def finished_ranks(run_dir: str, since: float) -> set[int]:
    """Ranks whose status says "ok", written at or after `since` (a time.time()): finished in this launch."""
    out = set()
    for rank, status in rank_statuses(run_dir).items():
        written = rank_files.status_written_at(run_dir, rank)
        if written is not None and written >= since and status.get("status") == "ok":
            out.add(rank)
    return out


def storage_error(status: dict) -> bool:
    """Whether a rank's status records an error of the storage (full, read-only, failing)."""
    return status.get("status") == "error" and bool(_STORAGE_ERROR.search(status.get("error") or ""))


def errored_ranks(statuses: dict[int, dict]) -> list[int]:
    """Ranks that recorded an error, those that blame the storage first (the verdict over any peer's error)."""
    errored = sorted(r for r, st in statuses.items() if st.get("status") == "error")
    return sorted(errored, key=lambda r: not storage_error(statuses[r]))


def _silent(failure: RankFailure, statuses: dict[int, dict]) -> bool:
    return failure.code < 0 or failure.rank not in statuses


def failed_ranks(run_dir: str, agent_output: str) -> list[int]:
    """Failed ranks, the likely culprit first: a recorded storage error, silent deaths, then torchrun's root cause,
    then the rest."""
    return _ordered(agent_failures(agent_output), rank_statuses(run_dir), agent_output)


def _ordered(failures: dict[int, RankFailure], statuses: dict[int, dict], agent_output: str) -> list[int]:
    root = agent_output.split("Root Cause", 1)
    root_rank = [int(m[2]) for m in _FAILURE.findall(root[1])[:1]] if len(root) == 2 else []
    errored = errored_ranks(statuses)
    storage = [r for r in errored if storage_error(statuses[r])]
    silent = [f.rank for f in sorted(failures.values(), key=_death_order) if _silent(f, statuses)]
    ordered: list[int] = []
    for r in storage + silent + root_rank + sorted(failures) + errored:
        if r not in ordered:
            ordered.append(r)
    return ordered


def culprit_node(run_dir: str, outputs: list[str], exit_codes: list[int | None], failure_order: list[int]) -> int:
    """Of several nodes' agents (outputs and exit codes by node index), the one whose failure came first in
    cause: a node whose rank recorded a storage error, then a node with a silent rank death, or whose ssh
    connection broke, before nodes whose ranks only errored; among equals, the one that failed first
    (failure_order lists every failed node, first failure first)."""
    statuses = rank_statuses(run_dir)
    failed = [n for n in failure_order if exit_codes[n] not in (None, 0)]

    def tier(node: int) -> int:
        failures = agent_failures(outputs[node])
        if any(storage_error(statuses.get(r, {})) for r in failures):
            return 0
        if any(_silent(f, statuses) for f in failures.values()):
            return 1
        return 1 if exit_codes[node] == SSH_ERROR and not failures else 2

    return min(failed, key=lambda n: (tier(n), failed.index(n)))


def read_only(run_dir: str) -> str:
    """Why nothing could be recorded in run_dir when its file system is read-only (a rank's status, job.json's
    exit code: a full disk leaves room for those), else ''."""
    try:
        if os.statvfs(run_dir).f_flag & os.ST_RDONLY:
            return f"read-only file system at {run_dir} (nothing of how it ended could be recorded)"
    except OSError:
        pass
    return ""


def tail(path: str, n: int = 20) -> list[str]:
    try:
        with open(path, errors="replace") as f:
            return f.read().splitlines()[-n:]
    except FileNotFoundError:
        return []


# A collective that waited too long: gloo ("Timed out waiting 10000ms for recv"), NCCL's watchdog ("...ran for
# 600000 milliseconds before timing out"), the store ("Socket Timeout").
_TIMEOUT = re.compile(r"timed? ?out|timeout|timing out", re.IGNORECASE)
# The last exception line of a Python traceback, e.g. "OSError: [Errno 28] No space left on device".
_ERROR_LINE = re.compile(r"^\s*([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt)\b:?.*)$", re.MULTILINE)
_ERROR_CHARS = 200  # of an error message quoted in the summary line


def _first_line(error: str | None) -> str:
    line = (error or "").strip().splitlines()[0] if (error or "").strip() else ""
    return line if len(line) <= _ERROR_CHARS else line[:_ERROR_CHARS - 3] + "..."


def _hung_for(rank: int, failure: RankFailure | None, failures: dict[int, RankFailure],
              statuses: dict[int, dict]) -> int | None:
    """The peer that timed out waiting for `rank`, when `rank` is a rank that stopped responding: it wrote no
    status and was killed by a signal (torchrun stops the survivors after a failure) while a peer recorded a
    collective timeout no later than that death. None otherwise."""
    if failure is None or failure.code >= 0 or rank in statuses:
        return None
    for peer, status in sorted(statuses.items()):
        if status.get("status") != "error" or not _TIMEOUT.search(status.get("error") or ""):
            continue
        theirs = failures.get(peer)
        if theirs is None or not (theirs.time and failure.time) or theirs.time <= failure.time:
            return peer
    return None


def _agent_error(agent_output: str) -> str:
    """The last exception line of torchrun's own output that is not its 'a child failed' summary."""
    lines = [m for m in _ERROR_LINE.findall(agent_output) if "ChildFailedError" not in m]
    return _first_line(lines[-1]) if lines else ""


def _no_culprit(console: Console, run_dir: str, agent_output: str, exit_code: int,
                statuses: dict[int, dict]) -> None:
    """No rank failed by torchrun's account or its own: name what was said (a status's error, else torchrun's)."""
    errors = sorted({_first_line(s.get("error")) for s in statuses.values() if s.get("error")} - {""})
    said = errors[0] if len(errors) == 1 else _agent_error(agent_output)
    why = f": {said}" if said else " (no rank reported an error"
    end = f"; see {RunPaths(run_dir).logs}" + ("" if said else ")")
    console.print(f"[bold red]llmtrain: the job failed with exit code {exit_code}[/]{escape(why + end)}",
                  highlight=False)


def report_failure(console: Console, run_dir: str, agent_output: str, exit_code: int,
                   node: int | None = None, host: str | None = None) -> None:
    """Name the culprit rank (its node, host and local rank: as the rank recorded them, else as torchrun
    reported them, else `node`/`host` when the caller knows them), what it died of or the error it recorded, and
    print the tail of its log."""
    failures, statuses = agent_failures(agent_output), rank_statuses(run_dir)
    ranks = _ordered(failures, statuses, agent_output)
    if not ranks:
        _no_culprit(console, run_dir, agent_output, exit_code, statuses)
        return
    rank = ranks[0]
    failure = failures.get(rank)
    status = statuses.get(rank, {})
    if failure is None:
        how = f"job exit code {exit_code}"
    else:
        how = f"signal {-failure.code}" if failure.code < 0 else f"exit code {failure.code}"
    who = describe_rank(run_dir, rank, host=(failure.host if failure else None) or status.get("host") or host,
                        local_rank=failure.local_rank if failure else None, node=node)
    log = RunPaths(run_dir).rank_log(rank)
    peer = _hung_for(rank, failure, failures, statuses)
    if peer is not None:
        said = escape(f": rank {peer} timed out waiting for it in a collective "
                      f"({_first_line(statuses[peer].get('error'))}), and it was then killed ({how}); last lines "
                      f"of {log}:")
        console.print(f"[bold red]llmtrain: {escape(who)} hung (stopped responding)[/]{said}", highlight=False)
        _print_tail(console, log, _stand_ins(run_dir, rank, first=peer, node=node))
        return
    error = _first_line(status.get("error")) or (read_only(run_dir) if not status else "")
    said = escape((f": {error}" if error else "") + f"; last lines of {log}:")
    console.print(f"[bold red]llmtrain: {escape(who)} failed ({how})[/]{said}", highlight=False)
    _print_tail(console, log, _stand_ins(run_dir, rank, first=0, node=node))


def _stand_ins(run_dir: str, rank: int, first: int, node: int | None) -> list[tuple[str, str]]:
    """(what, path) of the logs to show when `rank`'s own is empty (a rank killed outright, or one other than 0,
    which log little): rank `first`'s, then its node agent's (torchrun's account of the death)."""
    paths = RunPaths(run_dir)
    logs = paths.logs
    out = [(f"rank {first}'s log", paths.rank_log(first))] if first != rank else []
    placed = read_places(run_dir).get(rank, {}).get("node")
    node = node if placed is None else placed
    agents = [paths.node_log(node)] if node is not None else \
        sorted(os.path.join(logs, n) for n in _names(logs) if re.fullmatch(r"node\d+\.log", n))
    if len(agents) == 1:
        out.append(("its node agent's log", agents[0]))
    return out


def _names(folder: str) -> list[str]:
    try:
        return os.listdir(folder)
    except FileNotFoundError:
        return []


def _print_tail(console: Console, log: str, stand_ins: list[tuple[str, str]]) -> None:
    """The log's last lines; when it is empty, those of the first stand-in log that has any."""
    lines = tail(log)
    if not lines:
        note = ""
        for what, path in stand_ins:
            lines = tail(path)
            if lines:
                note = f"; last lines of {what}, {path}:"
                break
        plain(f"  (its log is empty{note})", console=console)
    for line in lines:
        plain(f"  {line}", console=console)


def stopped_short(statuses: dict[int, dict]) -> str | None:
    """Why ranks that all ended well stopped before train.max_steps (train.stop_at_step), in words; None when they
    reached it (or their statuses predate the step being recorded)."""
    steps = [s.get("step") for s in statuses.values()]
    goals = [s.get("max_steps") for s in statuses.values()]
    if not steps or not all(isinstance(v, int) for v in steps + goals):
        return None
    step, goal = max(steps), max(goals)
    if step >= goal:
        return None
    return (f"stopped at step {step} (train.stop_at_step); {goal - step} steps left; the same command continues "
            "with a later train.stop_at_step, or without it")
