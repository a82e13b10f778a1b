"""Checkpoint folders on disk: naming, completeness, verification, listing, pruning. No torch.distributed here.

A checkpoint is RUN_DIR/checkpoints/step-NNNNNNN/ holding the DCP shard files, config.yaml and meta.json. It is
written as step-NNNNNNN.tmp/ and renamed only after every rank finished writing and meta.json (with each file's
size and CRC32) is on disk. A crash mid-save leaves only a .tmp folder, which resume ignores (and says so); a folder
without the suffix finished its save, so one whose meta.json is missing or whose files disagree with it is corrupt.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import zlib
from dataclasses import dataclass

# A damaged checkpoint is a CheckpointError (exit 1); one asked for wrongly is a CheckpointUsageError (exit 2).
from llmtrain.errors import CheckpointError, CheckpointUsageError
from llmtrain.rundir.atomic import atomic_write_json, publish_dir
from llmtrain.rundir.paths import RunPaths

META = "meta.json"
DCP_METADATA = ".metadata"
_NAME = re.compile(r"^step-(\d{7,})(\.tmp)?$")


def checkpoints_dir(run_dir: str) -> str:
    return RunPaths(run_dir).checkpoints


def step_dir(run_dir: str, step: int) -> str:
    return os.path.join(checkpoints_dir(run_dir), f"step-{step:07d}")


@dataclass
class CheckpointInfo:
    path: str
    step: int
    complete: bool
    meta: dict | None
    partial: bool = False  # a .tmp folder: its save did not finish

    @property
    def corrupt(self) -> bool:
        """Renamed from .tmp (so its save finished), yet without a readable meta.json."""
        return not self.partial and self.meta is None

    @property
    def size_bytes(self) -> int:
        total = 0
        for root, _, files in os.walk(self.path):
            total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
        return total


def list_checkpoints(run_dir: str) -> list[CheckpointInfo]:
    """All checkpoint folders of a run, oldest first; complete ones have meta.json and no .tmp suffix."""
    base = checkpoints_dir(run_dir)
    try:
        names = os.listdir(base)
    except FileNotFoundError:
        return []
    infos = []
    for name in names:
        match = _NAME.match(name)
        path = os.path.join(base, name)
        if not match or not os.path.isdir(path):
            continue
        partial = match.group(2) is not None
        meta = None if partial else read_meta(path)
        infos.append(CheckpointInfo(path, int(match.group(1)), meta is not None, meta, partial))
    return sorted(infos, key=lambda i: (i.step, i.complete))


def read_meta(path: str) -> dict | None:
    try:
        with open(os.path.join(path, META)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def latest_complete(run_dir: str) -> tuple[CheckpointInfo | None, list[CheckpointInfo]]:
    """The newest complete checkpoint, and the partial (.tmp) ones newer than it (to report as ignored)."""
    infos = list_checkpoints(run_dir)
    complete = [i for i in infos if i.complete]
    latest = complete[-1] if complete else None
    ignored = [i for i in infos if i.partial and (latest is None or i.step >= latest.step)]
    return latest, ignored


def newest_step(run_dir: str) -> int | None:
    """The step of the newest complete checkpoint; None when there is none."""
    latest, _ = latest_complete(run_dir)
    return latest.step if latest else None


def newest_usable(run_dir: str) -> tuple[CheckpointInfo | None, list[CheckpointInfo]]:
    """latest_complete, refusing a corrupt folder newer than the newest complete one: resuming an older state
    instead would silently drop (and later overwrite) the run's newest save."""
    latest, ignored = latest_complete(run_dir)
    newer = [i for i in list_checkpoints(run_dir) if i.corrupt and (latest is None or i.step > latest.step)]
    if newer:
        raise corrupt_error(newer[-1].path)
    return latest, ignored


def corrupt_error(path: str) -> CheckpointError:
    return CheckpointError(path, f"corrupt checkpoint: {META} is missing or unreadable, though the folder was "
                                 "renamed from .tmp (its save finished); move the folder away to resume from an "
                                 "earlier checkpoint")


def is_step_folder_name(path: str) -> bool:
    """Whether `path` is named like a checkpoint folder of a run (step-NNNNNNN, or its .tmp)."""
    return _NAME.match(os.path.basename(os.path.normpath(path))) is not None


def is_checkpoint_folder(path: str) -> bool:
    """A folder with DCP's .metadata or a meta.json, or named step-NNNNNNN, and no checkpoints/ of its own."""
    if os.path.isdir(checkpoints_dir(path)):
        return False
    return (os.path.exists(os.path.join(path, DCP_METADATA)) or os.path.exists(os.path.join(path, META))
            or is_step_folder_name(path))


def checkpoint_or_newest(path: str) -> tuple[str, bool]:
    """`path` if it is a checkpoint folder, else the newest complete checkpoint of the run directory `path`.

    A folder with a checkpoints/ subfolder is a run directory; so is any other existing folder that is not a
    checkpoint (no DCP .metadata, no meta.json, not named step-NNNNNNN). Returns (checkpoint folder, whether
    `path` was a run directory); a run directory without a complete checkpoint is a CheckpointUsageError naming it.
    A missing path is returned as is, for the caller to report.
    """
    if not os.path.isdir(path):
        return path, False
    has_checkpoints = os.path.isdir(checkpoints_dir(path))
    if is_checkpoint_folder(path):
        return path, False
    latest, _ = latest_complete(path)
    if latest is None:
        unusable = list_checkpoints(path)
        if not has_checkpoints:
            detail = f"{checkpoints_dir(path)} does not exist, and {path} is not a checkpoint folder either"
        elif unusable:
            names = ", ".join(os.path.basename(i.path) + ("" if i.partial else " (no meta.json)")
                              for i in unusable)
            detail = f"{checkpoints_dir(path)} holds only incomplete ones: {names}"
        else:
            detail = f"{checkpoints_dir(path)} holds no step-NNNNNNN folder"
        raise CheckpointUsageError(path, f"run directory without a complete checkpoint ({detail})")
    latest, _ = newest_usable(path)  # a corrupt newer folder is an error, not a reason to fall back
    return latest.path, True


def file_manifest(path: str) -> dict[str, dict]:
    """{relative file: {bytes, crc32}} of every data file in a checkpoint folder."""
    manifest = {}
    for name in sorted(os.listdir(path)):
        full = os.path.join(path, name)
        if name == META or not os.path.isfile(full):
            continue
        manifest[name] = {"bytes": os.path.getsize(full), "crc32": file_crc32(full)}
    return manifest


def verify(path: str, crc: bool = True) -> dict:
    """Check every file against meta.json; a missing, truncated or (crc=True) altered file is an error naming
    it. The launcher checks CRCs once before starting; workers check sizes (cheap) on every (re)start."""
    meta = read_meta(path)
    if meta is None:
        raise CheckpointError(path, f"missing or unreadable {META}: not a complete checkpoint")
    if not os.path.isfile(os.path.join(path, DCP_METADATA)):
        raise CheckpointError(os.path.join(path, DCP_METADATA), "DCP's index of the shards is missing")
    for name, expect in meta.get("files", {}).items():
        full = os.path.join(path, name)
        if not os.path.isfile(full):
            raise CheckpointError(full, "checkpoint file is missing")
        size = os.path.getsize(full)
        if size != expect["bytes"]:
            raise CheckpointError(full, f"checkpoint file is truncated or altered: {size} bytes, "
                                        f"{expect['bytes']} written")
        if crc and file_crc32(full) != expect["crc32"]:
            raise CheckpointError(full, "checkpoint file is corrupted (CRC32 differs from the one written)")
    return meta


def finalize(tmp_path: str, meta: dict) -> str:
    """Write meta.json (with the file manifest) into tmp_path and rename it to its final name."""
    meta = dict(meta, files=file_manifest(tmp_path))
    atomic_write_json(os.path.join(tmp_path, META), meta, indent=1)
    final = tmp_path[: -len(".tmp")]
    if os.path.exists(final):  # a finished save of the same step from an earlier attempt
        shutil.rmtree(final)
    publish_dir(tmp_path, final)
    return final


def prune(run_dir: str, keep: int, protect: str | None = None) -> list[str]:
    """Delete all but the newest `keep` complete checkpoints, and partial ones older than the newest complete.

    `protect` (the checkpoint just saved) is always kept and counts towards `keep`: a run directory can hold
    higher steps from an earlier attempt, which must not push the run's own newest save out. Corrupt folders
    are left for the user to look at."""
    infos = list_checkpoints(run_dir)
    complete = [i for i in infos if i.complete]
    doomed = _beyond_keep(complete, keep, protect) if keep else []
    newest = complete[-1].step if complete else None
    doomed += [i for i in infos if i.partial and newest is not None and i.step < newest]
    for info in doomed:
        shutil.rmtree(info.path, ignore_errors=True)
    return [i.path for i in doomed]


def _beyond_keep(complete: list[CheckpointInfo], keep: int, protect: str | None) -> list[CheckpointInfo]:
    """The complete checkpoints (oldest first) that `keep` leaves out, never `protect`."""
    protect = os.path.normpath(protect) if protect else None
    others = [i for i in complete if os.path.normpath(i.path) != protect]
    slots = keep - (len(others) < len(complete))
    return others[: max(0, len(others) - slots)]


def remove_partials(run_dir: str) -> list[str]:
    """Delete every .tmp folder: only safe while no save is in flight (when a launch starts)."""
    doomed = [i.path for i in list_checkpoints(run_dir) if i.partial]
    for path in doomed:
        shutil.rmtree(path, ignore_errors=True)
    return doomed


def check(info: CheckpointInfo) -> str | None:
    """Why a checkpoint folder cannot be resumed, or None: the launcher's checks short of the CRC32 (meta.json,
    DCP's .metadata, every file of the manifest present with its size)."""
    if info.partial:
        return None
    try:
        verify(info.path, crc=False)
    except CheckpointError as e:
        where = os.path.relpath(e.key, info.path)
        return e.message if where == "." else f"{where}: {e.message}"
    return None


def file_crc32(path: str) -> int:
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            crc = zlib.crc32(chunk, crc)
    return crc
