"""`llmtrain status RUN_DIR [--json]`: the job behind a run directory and how far it got.

The state and its reason (state.py), the backend, launch number and job id, the nodes (and each start's node
count and layout when a launch started more than once or on fewer nodes than asked), the step reached of
max_steps, the newest complete checkpoint, the last metrics row (loss, tokens/s, MFU where it has one to show, else
a line why: rundir/mfu_field.py) and the run's training time (the last row's elapsed_s, which counts every launch
of the run), the newest stragglers named, the loss-spike rollbacks so far (RUN_DIR/spikes.json), and the goodput
ledger summed over the run's starts. --json prints the same facts as one object.
"""

from __future__ import annotations

import json
import os
import shlex

from llmtrain.checkpoint import store
from llmtrain.errors import EXIT_FAILED, EXIT_HANGUP, EXIT_INTERRUPTED, EXIT_OK, EXIT_PREEMPTED, ObjectStoreError
from llmtrain.jobs import named_run_dir
from llmtrain.rundir.job_record import read_launches
from llmtrain.rundir.mfu_field import not_shown, shown_mfu
from llmtrain.jobs.job_state import PENDING, JobState, job_state, launcher_owned
from llmtrain.rundir import goodput
from llmtrain.rundir.metrics_file import read_metrics
from llmtrain.rundir.node_ledger import read_ledger
from llmtrain.rundir.spike_record import read_rollbacks, summary
from llmtrain.rundir.paths import RunPaths

TAIL_BYTES = 1 << 16  # the last train row is near the end of metrics.jsonl: read only this much first


def last_train_row(run_dir: str) -> dict:
    """The last metrics row of a train step ({} when none): from the file's tail, the whole file if need be."""
    path = RunPaths(run_dir).metrics
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            f.seek(max(0, size - TAIL_BYTES))
            tail = f.read().splitlines()
    except FileNotFoundError:
        return {}
    if size > TAIL_BYTES:
        tail = tail[1:]  # begins mid-line
    for raw in reversed(tail):
        row = _train_row(raw)
        if row:
            return row
    rows = [r for r in read_metrics(path) if "loss" in r] if size > TAIL_BYTES else []
    return rows[-1] if rows else {}


def _train_row(raw: bytes) -> dict | None:
    try:
        row = json.loads(raw)
    except ValueError:
        return None
    return row if isinstance(row, dict) and "loss" in row else None


def facts(run_dir: str, cfg, job: JobState | None = None) -> dict:
    """Everything status reports, as one JSON-ready dict."""
    job = job or job_state(run_dir)
    launch = job.launch
    row = last_train_row(run_dir)
    try:
        latest, unreadable = store.latest_complete(run_dir)[0], None
    except ObjectStoreError as e:  # the rest of the status still helps while the store does not answer
        latest, unreadable = None, f"unknown: {e}"
    ledger = read_ledger(run_dir)
    nodes = job.slurm.nodes if job.slurm and job.slurm.nodes else launch.get("hosts")
    launcher = launch.get("launcher") or ({"host": job.holder.get("host"), "pid": job.holder.get("pid")}
                                          if job.holder.get("pid") and not job.holder.get("job") else None)
    return {
        "run_dir": run_dir, "run_name": cfg.run.name, "state": job.state, "reason": job.reason,
        "backend": launch.get("backend") or cfg.cluster.name, "launch": launch.get("launch"),
        "job_id": job.job_id, "slurm_state": job.slurm.state if job.slurm else None, "launcher": launcher,
        "nodes": nodes, "started": launch.get("started"), "overrides": launch.get("overrides"),
        # The step reached: a preemption can save a step that the metrics rows (every log_interval) skipped.
        "step": max(row.get("step", 0), latest.step if latest else 0), "max_steps": cfg.train.max_steps,
        "checkpoint": {"step": latest.step, "path": latest.path} if latest else None,
        "checkpoint_unreadable": unreadable,
        "metrics_step": row.get("step"), "loss": row.get("loss"), "tokens_per_s": row.get("tokens_per_s"),
        "mfu": shown_mfu(row), "mfu_note": _mfu_note(row, cfg), "elapsed_s": row.get("elapsed_s"),
        "launches": read_launches(run_dir),
        # The Slurm job's own account (nodes.json): the hosts its requeue leaves out, why it stopped requeueing.
        "excluded_nodes": (ledger.get("excluded") or {}).get("hosts"),
        "stopped": (ledger.get("stopped") or {}).get("reason"),
        "stragglers": last_stragglers(run_dir), "goodput": goodput.read_ledger(run_dir),
        "rollbacks": read_rollbacks(run_dir),  # loss spikes rolled back (RUN_DIR/spikes.json)
        # Each start of this launch: its node count and layout (launch/shape/start_record.py).
        "starts": launch.get("starts") or [],
    }


def _mfu_note(row: dict, cfg) -> str | None:
    """Why the last row shows no MFU; None when it does, or when there is no row yet."""
    return not_shown([row], cfg.precision.compute_dtype) if row and shown_mfu(row) is None else None


def last_stragglers(run_dir: str) -> dict | None:
    """The newest metrics row that named stragglers: {step, stragglers}, or None."""
    rows = [r for r in read_metrics(RunPaths(run_dir).metrics) if r.get("stragglers")]
    return {"step": rows[-1].get("step"), "stragglers": rows[-1]["stragglers"]} if rows else None


def straggler_line(named: dict) -> str:
    ranks = ", ".join(f"rank {s.get('rank')} (host {s.get('host')}) {s.get('slowdown', 0):.2f}x"
                      for s in named["stragglers"])
    return f"{ranks} the median compute time, named at step {named['step']}"


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, s = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {s:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def _metrics_line(f: dict) -> str:
    if f["loss"] is None:
        return "-"
    parts = [f"loss {f['loss']:.4f}" if isinstance(f["loss"], float) else f"loss {f['loss']}"]
    if isinstance(f["tokens_per_s"], (int, float)):
        parts.append(f"{f['tokens_per_s']:,.0f} tok/s")
    if isinstance(f["mfu"], (int, float)):
        parts.append(f"MFU {f['mfu']:.1%}")
    return f"step {f['metrics_step']}: " + " | ".join(parts)


def start_words(nodes, of, layout, when: str | None, note: str | None = None) -> str:
    """One start: `1 of 2 nodes dp=1 tp=1 pp=1 (06:08)`; `of` only when the start had fewer nodes than asked."""
    if not isinstance(nodes, int):  # a record this llmtrain did not write
        count = "? nodes"
    else:
        count = f"{nodes} of {of} nodes" if isinstance(of, int) and nodes < of else \
            f"{nodes} node{'' if nodes == 1 else 's'}"
    inside = ", ".join(w for w in (when, note) if w)
    return f"{count} {layout or '?'}" + (f" ({inside})" if inside else "")


def starts_line(starts: list[dict]) -> str | None:
    """Every start of a launch, oldest first, when it had more than one or one on fewer nodes than asked; None
    otherwise (the nodes line says it all)."""
    def fewer(s: dict) -> bool:
        return isinstance(s.get("nnodes"), int) and isinstance(s.get("of"), int) and s["nnodes"] < s["of"]

    if len(starts) < 2 and not any(fewer(s) for s in starts):
        return None
    # job.json's time is "YYYY-MM-DD HH:MM:SS": the hour and minute tell the starts of one launch apart.
    return ", ".join(start_words(s.get("nnodes"), s.get("of"), s.get("layout"), (s.get("time") or "")[11:16])
                     for s in starts)


def _job_line(f: dict) -> str:
    where = f"{f['backend']}" + (f", launch {f['launch']}" if f["launch"] else "")
    if f["job_id"]:
        where += f", Slurm job {f['job_id']}" + (f" ({f['slurm_state']})" if f["slurm_state"] else "")
    if f["launcher"]:
        where += f", launcher pid {f['launcher']['pid']} on {f['launcher']['host']}"
    return where + (f", started {f['started']}" if f["started"] else "")


# What a local or ssh launcher's exit code says (a Slurm launcher exits 0 once sbatch took the job).
EXIT_MEANINGS = {EXIT_OK: "finished", EXIT_FAILED: "failed", EXIT_INTERRUPTED: "interrupted",
                 EXIT_PREEMPTED: "preempted", EXIT_HANGUP: "hung up"}


def _launch_line(entry: dict) -> str:
    code = entry.get("exit_code")
    if code is not None:
        meaning = EXIT_MEANINGS.get(code) if launcher_owned(entry.get("backend")) else None
        end = f"exit {code}" + (f" ({meaning})" if meaning else "")
    else:
        end = "running or killed" if entry.get("ended") is None else "ended with an error"
    job = f" Slurm job {entry['job_id']}" if entry.get("job_id") else ""
    return f"{entry.get('launch')}: {entry.get('started')} {entry.get('backend')}{job}, {end}"


def lines(f: dict) -> list[str]:
    """The human-readable status: one fact per line."""
    checkpoint = f"step {f['checkpoint']['step']} in {f['checkpoint']['path']}" if f["checkpoint"] else \
        f.get("checkpoint_unreadable") or "none"
    nodes = ", ".join(f["nodes"]) if f["nodes"] else ("not assigned yet" if f["state"] == PENDING else "-")
    out = [("run", f"{f['run_dir']} ({f['run_name']})"), ("state", f"{f['state']}: {f['reason']}"),
           ("job", _job_line(f)), ("nodes", nodes), ("step", f"{f['step']} / {f['max_steps']}"),
           ("checkpoint", checkpoint), ("last row", _metrics_line(f))]
    starts = starts_line(f.get("starts") or [])
    if starts:
        out.insert(4, ("starts", starts))
    if f["mfu_note"]:
        out.append(("MFU", f["mfu_note"]))
    out.append(("elapsed", duration(f["elapsed_s"])))
    if f["overrides"]:
        out.append(("overrides", shlex.join(f["overrides"])))
    if f["excluded_nodes"]:
        out.append(("excluded", ", ".join(f["excluded_nodes"]) + " (bad nodes, RUN_DIR/nodes.json)"))
    if f["stragglers"]:
        out.append(("stragglers", straggler_line(f["stragglers"])))
    if f.get("rollbacks"):
        out.append(("rollbacks", f"{len(f['rollbacks'])} so far: " + "; ".join(map(summary, f["rollbacks"]))))
    text = [f"{key:<11} {value}" for key, value in out]
    for i, (key, value) in enumerate(goodput.summary_lines(f["goodput"])):
        text.append(f"{key:<11} {value}" if i == 0 else f"  {key + ':':<17} {value}")
    if len(f["launches"]) > 1:
        text.append("launches")
        text += [f"  {_launch_line(entry)}" for entry in f["launches"]]
    return text


def run_status(args) -> int:
    run_dir, cfg = named_run_dir.load(args.run_dir)
    f = facts(run_dir, cfg)
    if args.json:
        print(json.dumps(f))
    else:
        print("\n".join(lines(f)))
    return EXIT_OK
