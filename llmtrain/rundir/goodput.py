"""RUN_DIR/goodput.json, the goodput ledger: for each start of a run (a launch, or a Slurm job's start; a requeue
is a new start), where its allocated time went.

The workers' rank 0 writes a timeline, RUN_DIR/logs/goodput-events.jsonl (llmtrain.train.goodput_events); at the
end of a start the launcher side turns it into one ledger entry. The parts partition the start's allocated time:
- queue: Slurm submit to start (0 for local and ssh launches);
- startup: the start to the first training step's beginning (process start, rendezvous, model build, resume);
- productive: training whose work was kept (up to the checkpoint the next attempt resumed from, or the end);
- checkpoint: time the training loop was blocked in checkpoint saves that were kept;
- lost: training (and saves) after the last kept checkpoint of an attempt that failed: that work is redone;
- restart: from an attempt's last event to the next attempt's first step (detection, restart, resume);
- shutdown: the last event to the start's end.
The launcher's clock (start, end) and rank 0's (events) are compared, so across hosts they must agree.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections import defaultdict

from llmtrain.rundir.atomic import atomic_write_json
from llmtrain.rundir.json_list import read_entries
from llmtrain.rundir.unwritten import warn_unwritten
from llmtrain.rundir.paths import RunPaths

PARTS = ("queue_s", "startup_s", "checkpoint_s", "lost_s", "restart_s", "shutdown_s")


def events_path(run_dir: str) -> str:
    return RunPaths(run_dir).goodput_events


def ledger_path(run_dir: str) -> str:
    return RunPaths(run_dir).goodput


def read_events(run_dir: str) -> list[dict]:
    """Every readable event line, in file order (a line cut short by a kill is skipped)."""
    out = []
    try:
        with open(events_path(run_dir), "rb") as f:
            for raw in f:
                with contextlib.suppress(ValueError):
                    event = json.loads(raw)
                    if isinstance(event, dict) and isinstance(event.get("t"), (int, float)):
                        out.append(event)
    except OSError:
        pass
    return out


def clear_events(run_dir: str) -> None:
    """At a start, before any worker runs: the timeline begins empty."""
    with contextlib.suppress(FileNotFoundError):
        os.remove(events_path(run_dir))


def ledger_entry(events: list[dict], started: float, ended: float, queue_s: float = 0.0,
                 kept_step: int | None = None) -> dict:
    """One start's ledger from its events. started/ended: the start's wall-clock bounds; kept_step: the step of
    the newest complete checkpoint at the end (what a relaunch resumes from), for a last attempt that did not
    finish."""
    attempts: dict[int, list[dict]] = defaultdict(list)
    for event in events:
        attempts[int(event.get("attempt", 0))].append(event)
    trained = [a for a in sorted(attempts) if attempts[a][0].get("event") == "train"]
    parts = dict.fromkeys(("productive_s", *PARTS), 0.0)
    parts["queue_s"] = queue_s
    previous_end = None
    for i, a in enumerate(trained):
        timeline = attempts[a]
        begin, end = timeline[0]["t"], timeline[-1]["t"]
        if previous_end is None:
            parts["startup_s"] = begin - started
        else:
            parts["restart_s"] += begin - previous_end
        previous_end = end
        resumed = attempts[trained[i + 1]][0].get("step") if i + 1 < len(trained) else kept_step
        finished = timeline[-1].get("event") == "end"
        kept_until = end if finished else _kept_until(timeline, resumed)
        saves = sum(e.get("blocked_s", 0.0) for e in timeline if e.get("event") == "save" and e["t"] <= kept_until)
        parts["checkpoint_s"] += saves
        parts["productive_s"] += kept_until - begin - saves
        parts["lost_s"] += end - kept_until
    if previous_end is None:  # no attempt reached its first step: all of it was start-up
        parts["startup_s"] = ended - started
    else:
        parts["shutdown_s"] = ended - previous_end
    allocated = queue_s + ended - started
    return {**{k: round(v, 3) for k, v in parts.items()}, "allocated_s": round(allocated, 3),
            "goodput": round(parts["productive_s"] / allocated, 4) if allocated > 0 else None,
            "restarts": max(attempts, default=0), "requeues": max((int(e.get("requeue", 0)) for e in events),
                                                                   default=0)}


def _kept_until(timeline: list[dict], resumed: int | None) -> float:
    """When the attempt had done the work the next attempt resumed from: the end of the save of that step, or the
    attempt's first step when it saved nothing newer (all its training is lost)."""
    for event in reversed(timeline):
        if event.get("event") == "save" and event.get("step") == resumed:
            return event["t"]
    return timeline[0]["t"]


def read_ledger(run_dir: str) -> list[dict]:
    """Every start's entry, oldest first; [] when there is no (readable) ledger."""
    return read_entries(ledger_path(run_dir), "starts")


def append_entry(run_dir: str, entry: dict) -> None:
    """Atomically; a failed write (a full disk) leaves the ledger as it was, with one warning."""
    try:
        atomic_write_json(ledger_path(run_dir), {"starts": read_ledger(run_dir) + [entry]}, indent=1)
    except OSError as e:
        warn_unwritten(ledger_path(run_dir), e)


def totals(starts: list[dict]) -> dict:
    """The ledger summed over starts. An entry's `requeues` is its Slurm job's count so far (SLURM_RESTART_COUNT),
    so the run's requeues are its starts that were requeues."""
    keys = ("allocated_s", "productive_s", *PARTS, "restarts")
    return {**{k: sum(s.get(k) or 0 for s in starts) for k in keys},
            "requeues": sum(1 for s in starts if (s.get("requeues") or 0) > 0)}


def summary_lines(starts: list[dict]) -> list[tuple[str, str]]:
    """(label, value): goodput over every start, then one line per thing that took the rest."""
    if not starts:
        return []
    t = totals(starts)
    allocated = t["allocated_s"]
    share = (lambda s: f"{s:.1f} s ({s / allocated:.1%})") if allocated > 0 else (lambda s: f"{s:.1f} s")
    goodput = t["productive_s"] / allocated if allocated > 0 else 0.0
    return [("goodput", f"{goodput:.1%} = productive {t['productive_s']:.1f} s / allocated {allocated:.1f} s "
                        f"({len(starts)} start(s))"),
            ("queue", share(t["queue_s"])),
            ("start-up", share(t["startup_s"]) + f"; shutdown {share(t['shutdown_s'])}"),
            ("checkpoint saves", share(t["checkpoint_s"])),
            ("lost work", share(t["lost_s"])),
            ("restarts", f"{t['restarts']} restart(s), {t['requeues']} requeue(s): {share(t['restart_s'])}")]
