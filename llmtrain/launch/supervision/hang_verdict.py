"""The one-line hang verdict, from the evidence alone (pure functions, no files).

The collective that has waited longest is where the job stopped: the members of its group whose sequence number
on that group is behind it never entered it (the culprits); the ranks in it wait for them. A rank that skipped an
op and entered the next one on the same group has the same number, but another call site: the op that came after
the previous one in the ranks' recent history is the expected one. Each culprit's main thread stack says what it
does instead.
"""

from __future__ import annotations

import linecache
import re
from typing import Callable

IN_COLLECTIVE = "in a collective"
IN_DATA = "in data loading"
IN_OPTIMIZER = "in the optimizer step"
IN_BACKWARD = "in backward"
IN_FORWARD = "in forward"
SLEEPING = "sleeping"
UNKNOWN = "in unknown code"

_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')
# Where a frame anywhere on the stack puts the rank, most specific first.
_PLACES = ((IN_DATA, ("/llmtrain/data/", "/llmtrain/train/data_feed.py", "/torch/utils/data/")),
           (IN_OPTIMIZER, ("/torch/optim/", "/llmtrain/train/optim.py")),
           (IN_BACKWARD, ("/torch/autograd/",)),
           (IN_FORWARD, ("/llmtrain/model/", "/torch/nn/modules/")))


def main_thread_frames(stacks: str) -> list[tuple[str, int, str]]:
    """(file, line, function) of the main thread in a faulthandler dump, innermost first. The main thread is the
    one not started by threading (whose outermost frame is threading's _bootstrap)."""
    threads, current = [], []
    for line in stacks.splitlines():
        if "(most recent call first)" in line:
            current = []
            threads.append(current)
        elif (m := _FRAME.match(line)) and threads:
            current.append((m["file"], int(m["line"]), m["func"]))
    main = [t for t in threads if t and t[-1][2] != "_bootstrap"]
    return main[-1] if main else []


# Wrappers between a collective and its caller, which say nothing about where the rank is (collective_wait's wraps
# Work.wait too, so it can be the innermost frame of a rank in a collective).
_WRAPPERS = ("/torch/distributed/c10d_logger.py", "/llmtrain/train/collective_trace.py",
             "/llmtrain/train/collective_wait.py")


def classify(frames: list[tuple[str, int, str]], source: Callable[[str, int], str] = linecache.getline) -> str:
    """What a rank's main thread does, from its frames (innermost first)."""
    frames = [frame for frame in frames if not frame[0].endswith(_WRAPPERS)]
    if not frames:
        return UNKNOWN
    if "/torch/distributed/" in frames[0][0]:
        return IN_COLLECTIVE
    for place, paths in _PLACES:
        if any(p in f for f, _, _ in frames for p in paths):
            return place
    if any(func == "backward" for _, _, func in frames):
        return IN_BACKWARD
    if "sleep(" in source(frames[0][0], frames[0][1]):
        return SLEEPING
    return UNKNOWN


def stack_summary(frames: list[tuple[str, int, str]], depth: int = 3) -> str:
    """The innermost frames, wrappers left out, as `func (file:line) < caller (...)`."""
    shown = [(f, line, func) for f, line, func in frames if not f.endswith(_WRAPPERS)][:depth]
    return " < ".join(f"{func} ({f.rsplit('/', 1)[-1]}:{line})" for f, line, func in shown)


def _ranks(ranks: list[int]) -> str:
    """[0, 1, 2, 5] -> "ranks 0-2, 5"; [3] -> "rank 3"."""
    runs: list[list[int]] = []
    for r in sorted(ranks):
        if runs and r == runs[-1][-1] + 1:
            runs[-1].append(r)
        else:
            runs.append([r])
    text = ", ".join(f"{run[0]}-{run[-1]}" if len(run) > 2 else ", ".join(map(str, run)) for run in runs)
    return ("ranks " if len(ranks) > 1 else "rank ") + text


def _pending(records: dict[int, dict]) -> list[tuple[float, str, int, str, int]]:
    """(entered_at, group, seq, op, rank) of every collective a rank entered and did not complete."""
    out = []
    for rank, record in records.items():
        for group, e in record.get("groups", {}).items():
            if e["seq"] > e["done"]:
                out.append((e.get("entered_at", 0.0), group, e["seq"], e["op"], rank))
    return sorted(out)


def _doing(rank: int, records: dict[int, dict], stacks: dict[int, str], states: dict[int, str]) -> str:
    """`rank N is in data loading (stack: ...)`, or why there is no stack."""
    if rank not in records:
        state = states.get(rank)
        return f"rank {rank} did not answer the stack request" + (f" (process {state})" if state else "")
    if rank not in stacks:
        return f"rank {rank} exited (its trace is the one it wrote on its way out)"
    frames = main_thread_frames(stacks.get(rank, ""))
    what = f"is {classify(frames)}"
    mine = _pending({rank: records[rank]})
    if what == f"is {IN_COLLECTIVE}" and mine:
        _, group, seq, op, _ = mine[-1]
        site = records[rank]["groups"][group].get("site")
        what = f"waits in {op} #{seq} on the {group} group" + (f" (from {site})" if site else "")
    return f"rank {rank} {what}" + (f" (stack: {stack_summary(frames)})" if frames else "")


def verdict(records: dict[int, dict], stacks: dict[int, str], world_size: int,
            describe: Callable[[int], str] = lambda r: f"rank {r}", states: dict[int, str] | None = None) -> str:
    """The verdict line, without the `llmtrain: hang: ` prefix.

    records: rank -> its collective trace (collective_trace.py's snapshot); stacks: rank -> its faulthandler dump;
    states: rank -> its process state when it did not answer ("stopped", "zombie", "gone")."""
    return verdict_and_culprits(records, stacks, world_size, describe, states)[0]


def verdict_and_culprits(records: dict[int, dict], stacks: dict[int, str], world_size: int,
                         describe: Callable[[int], str] = lambda r: f"rank {r}",
                         states: dict[int, str] | None = None) -> tuple[str, list[int]]:
    """The verdict line and the ranks it holds responsible (those that stayed behind; none when it cannot tell)."""
    states = states or {}
    pending = _pending(records)
    if not pending:
        doing = [_doing(r, records, stacks, states) for r in range(world_size)]
        return "no rank waits in a collective; " + "; ".join(doing), []
    _, group, seq, op, _ = pending[0]
    waiting = sorted({r for _, g, s, _, r in pending if (g, s) == (group, seq)})
    members = next(records[r]["groups"][group].get("ranks") for r in waiting)
    members = members if members else list(range(world_size))
    behind = [r for r in members if r not in records or records[r].get("groups", {}).get(group, {}).get("seq", 0) < seq]
    where = f"{op} #{seq} on the {group} group"
    if not behind:
        expected = _expected(records, group, seq, waiting)
        if expected is None:
            return (f"{_ranks(waiting)} wait in {where}, which every member entered (a transport or device "
                    "problem, not a rank that stayed behind)"), []
        op, site = expected
        where = f"{op} #{seq} on the {group} group (from {site})"
        behind = [r for r in waiting if records[r]["groups"][group].get("site") != site]
        waiting = [r for r in waiting if r not in behind]
        if not waiting:
            return f"ranks disagree on {where}: " + "; ".join(_doing(r, records, stacks, states) for r in behind), behind
    first = describe(behind[0])
    who = first if len(behind) == 1 else f"{first} and {_ranks(behind[1:])}"
    doing = "; ".join(_doing(r, records, stacks, states) for r in behind)
    return (f"{who} never entered {where}; {_ranks(waiting)} {'waits' if len(waiting) == 1 else 'wait'} in it; "
            f"{doing}"), behind


def _expected(records: dict[int, dict], group: str, seq: int, ranks: list[int]) -> tuple[str, str] | None:
    """(op, site) the ranks should all be in as #seq on group, when they are in ops from different call sites:
    what followed, earlier in a rank's recent history, the longest run of call sites that ends its history (the
    ops of a step repeat every step). None when they agree or the history does not tell."""
    entries = {r: records[r]["groups"][group] for r in ranks}
    if len({e.get("site") for e in entries.values()}) < 2:
        return None
    for e in entries.values():
        recent = [tuple(x) for x in e.get("recent", []) if x[0] < seq]  # [seq, op, site], ascending
        sites = [x[2] for x in recent]
        for k in range(len(sites) - 1, 0, -1):
            context = sites[-k:]
            for j in range(len(sites) - 1, k - 1, -1):
                if sites[j - k:j] == context:
                    return recent[j][1], recent[j][2]
    return None
