"""checkpoint.resume -> the checkpoint a run continues from, and why: the one resolver of the user's value.

The user writes auto | none | PATH, and config.yaml keeps it as written. The launcher resolves it before anything
starts (its message, its refusal checks, the dry run) and records what it chose in job.json's launch entry; the
workers' first start takes that record, so they load the checkpoint the launcher announced even where PATH would
read differently (another node's working directory). A torchrun restart or a requeued Slurm job continues from the
newest complete checkpoint of the run directory instead, whatever the user wrote.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from llmtrain.checkpoint import store
from llmtrain.checkpoint.storage import is_uri, local_path
from llmtrain.errors import CheckpointUsageError

KEY = "checkpoint.resume"


@dataclass(frozen=True)
class Resolution:
    """What `checkpoint.resume` resolved to: a checkpoint folder (None: a fresh start) and why."""

    value: str  # the user's value, as written
    checkpoint: str | None
    why: str
    ignored: tuple[store.CheckpointInfo, ...] = field(default=(), compare=False)  # newer partial (.tmp) folders

    def line(self) -> str:
        """One log line: the user's value, the checkpoint, and why it is that one."""
        target = self.checkpoint or "a fresh start"
        return f"llmtrain: {KEY}={self.value} -> {target} ({self.why})"

    def to_record(self) -> dict:
        """What job.json keeps of it (the partial folders are said once, by the launcher)."""
        return {"value": self.value, "checkpoint": self.checkpoint, "why": self.why}

    @classmethod
    def from_record(cls, record: object, value: str) -> Resolution | None:
        """The launcher's record of `value`; None when there is none, or it was made for another value (a record
        left by an earlier launch, when this launch could not write its own)."""
        if not isinstance(record, dict) or record.get("value") != value or "checkpoint" not in record:
            return None
        return cls(value, record["checkpoint"], str(record.get("why", "")))


def resolve_resume(run_dir, value: str) -> Resolution:
    """`value` (auto | none | PATH or URI) against the run directory `run_dir` (or its checkpoint tiers). Raises
    CheckpointUsageError naming
    checkpoint.resume (or the corrupt folder) when PATH is no complete checkpoint, or a corrupt folder is newer
    than the newest complete one."""
    if value == "none":
        return Resolution(value, None, "none: a fresh start")
    if value == "auto":
        latest, ignored = store.newest_usable(run_dir)
        if latest is None:
            return Resolution(value, None, f"auto: no complete checkpoint in {store.checkpoints_dir(run_dir)}",
                              tuple(ignored))
        why = f"auto: newest complete checkpoint {latest.path.rstrip('/').rsplit('/', 1)[-1]}" + \
            (" (the fast tier, checkpoint.local_dir)" if latest.tier == store.LOCAL else "")
        return Resolution(value, latest.path, why, tuple(ignored))
    path = value.rstrip("/") if is_uri(value) else os.path.abspath(os.path.expanduser(local_path(value)))
    if not store.exists(path):
        raise CheckpointUsageError(KEY, f"no such checkpoint folder: {value}")
    if path.endswith(".tmp"):
        raise CheckpointUsageError(KEY, f"{value} is not a complete checkpoint (its save did not finish)")
    if store.read_meta(path) is None:
        if store.is_step_folder_name(path):
            raise store.corrupt_error(path)
        raise CheckpointUsageError(KEY, f"{value} is not a complete checkpoint (no {store.META})")
    return Resolution(value, path, "PATH as given")


def resolve_in_worker(run_dir: str, value: str, launched: Resolution | None, restart: int,
                      requeued: int) -> Resolution:
    """A worker's resolution: after a torchrun restart or a Slurm requeue, the newest complete checkpoint of the
    run directory (the run has moved on since the launch), or, when it has none yet, what the first start loaded
    (a run begun from another directory's checkpoint goes back to it, not to step 0); at its first start, what the
    launcher resolved (`launched`, from job.json), else `value` itself (a worker started without a launcher's
    record)."""
    if restart or requeued:
        again = resolve_resume(run_dir, "auto")
        cause = f"restart {restart}" if restart else f"requeued job (restart {requeued})"
        if again.checkpoint is None and value != "none":
            first = launched if launched is not None else resolve_resume(run_dir, value)
            if first.checkpoint is not None:
                return Resolution(value, first.checkpoint, f"{cause}: no checkpoint saved here yet, so the one the "
                                                           f"run began from ({first.why})", again.ignored)
        return Resolution(value, again.checkpoint, f"{cause}: {again.why}", again.ignored)
    if launched is not None:
        return Resolution(value, launched.checkpoint, f"as the launcher resolved it: {launched.why}")
    return resolve_resume(run_dir, value)
