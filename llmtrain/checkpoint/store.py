"""Checkpoint folders: naming, completeness, verification, listing, pruning. No torch.distributed here.

A checkpoint is a step-NNNNNNN/ folder holding the DCP shard files, config.yaml and meta.json (each file's size and
CRC32), in the run's checkpoint location (location.py: RUN_DIR/checkpoints, `checkpoint.dir`, and the fast tier
`checkpoint.local_dir`). Every file operation goes through the location's storage (storage/):
- on a filesystem, a save is written as step-NNNNNNN.tmp/ and renamed once every rank finished and meta.json is on
  disk. A crash mid-save leaves only a .tmp folder, which resume ignores (and says so); a folder without the suffix
  finished its save, so one whose meta.json is missing or whose files disagree with it is corrupt;
- on an object store there is no rename: the save is written under its final name and meta.json, written last, is
  the commit marker. A folder without it is incomplete (an upload cut off), ignored and removed like a .tmp one.
"""

from __future__ import annotations

import json
import re
import zlib
from dataclasses import dataclass

# A damaged checkpoint is a CheckpointError (exit 1); one asked for wrongly is a CheckpointUsageError (exit 2).
from llmtrain.checkpoint.location import LOCAL, STORE, tiers_of
from llmtrain.checkpoint.storage import storage_for
from llmtrain.errors import CheckpointError, CheckpointUsageError
from llmtrain.rundir.paths import CHECKPOINTS

META = "meta.json"
DCP_METADATA = ".metadata"
_NAME = re.compile(r"^step-(\d{7,})(\.tmp)?$")


def checkpoints_dir(where) -> str:
    """The location checkpoints are kept in (`where`: a run directory, a config, or a location URI)."""
    return tiers_of(where).store


def step_dir(where, step: int, tier: str = STORE) -> str:
    location = tiers_of(where).at(tier)
    return storage_for(location).join(location, f"step-{step:07d}")


@dataclass
class CheckpointInfo:
    path: str
    step: int
    complete: bool
    meta: dict | None
    partial: bool = False  # a .tmp folder, or one without meta.json on an object store: its save did not finish
    tier: str = STORE  # STORE, or LOCAL: checkpoint.local_dir
    # Every file of its manifest is here: a fast tier on each node's own disk holds only that node's shards, so
    # its folders are sealed (meta.json) on every node yet whole on none; they are kept for their upload only.
    whole: bool = True

    @property
    def resumable(self) -> bool:
        return self.complete and self.whole

    @property
    def corrupt(self) -> bool:
        """Renamed from .tmp (so its save finished), yet without a readable meta.json."""
        return not self.partial and self.meta is None

    @property
    def size_bytes(self) -> int:
        return storage_for(self.path).tree_bytes(self.path)


def list_checkpoints(where) -> list[CheckpointInfo]:
    """All checkpoint folders of every tier, oldest first; at one step a complete one after an incomplete one, and
    the local tier's after the store's (the faster to read is the one chosen)."""
    infos = []
    for tier, location in tiers_of(where).each():
        infos += _list_at(location, tier)
    return sorted(infos, key=lambda i: (i.step, i.complete, i.tier == LOCAL))


def _list_at(location: str, tier: str) -> list[CheckpointInfo]:
    storage = storage_for(location)
    infos = []
    for name, is_dir in storage.listdir(location).items():
        match = _NAME.match(name)
        if not match or not is_dir:
            continue
        path = storage.join(location, name)
        staged = match.group(2) is not None
        meta = None if staged else read_meta(path)
        partial = staged or (not storage.renames and meta is None)
        whole = tier != LOCAL or meta is None or set(meta.get("files", {})) <= set(storage.sizes(path))
        infos.append(CheckpointInfo(path, int(match.group(1)), meta is not None, meta, partial, tier, whole))
    return infos


def read_meta(path: str) -> dict | None:
    storage = storage_for(path)
    try:
        return json.loads(storage.read_bytes(storage.join(path, META)))
    except (OSError, ValueError):
        return None


def latest_complete(where) -> tuple[CheckpointInfo | None, list[CheckpointInfo]]:
    """The newest complete checkpoint of any tier that is whole here, and the partial ones newer than it (to report
    as ignored)."""
    infos = list_checkpoints(where)
    complete = [i for i in infos if i.resumable]
    latest = complete[-1] if complete else None
    ignored = [i for i in infos if i.partial and (latest is None or i.step >= latest.step)]
    return latest, ignored


def newest_step(where) -> int | None:
    """The step of the newest complete checkpoint; None when there is none."""
    latest, _ = latest_complete(where)
    return latest.step if latest else None


def newest_usable(where) -> tuple[CheckpointInfo | None, list[CheckpointInfo]]:
    """latest_complete, refusing a corrupt folder newer than the newest complete one: resuming an older state
    instead would silently drop (and later overwrite) the run's newest save."""
    latest, ignored = latest_complete(where)
    newer = [i for i in list_checkpoints(where) if i.corrupt and (latest is None or i.step > latest.step)]
    if newer:
        raise corrupt_error(newer[-1].path)
    return latest, ignored


def corrupt_error(path: str) -> CheckpointError:
    return CheckpointError(path, f"corrupt checkpoint: {META} is missing or unreadable, though the folder was "
                                 "renamed from .tmp (its save finished); move the folder away to resume from an "
                                 "earlier checkpoint")


def is_step_folder_name(path: str) -> bool:
    """Whether `path` is named like a checkpoint folder of a run (step-NNNNNNN, or its .tmp)."""
    return _NAME.match(storage_for(path).basename(path)) is not None


def is_checkpoint_folder(path: str) -> bool:
    """A folder with DCP's .metadata or a meta.json, or named step-NNNNNNN, and no checkpoints/ of its own."""
    storage = storage_for(path)
    entries = storage.listdir(path)
    if entries.get(CHECKPOINTS):
        return False
    return DCP_METADATA in entries or META in entries or is_step_folder_name(path)


def exists(path: str) -> bool:
    return storage_for(path).isdir(path)


def checkpoint_or_newest(path: str) -> tuple[str, bool]:
    """`path` if it is a checkpoint folder, else the newest complete checkpoint of the run directory (or checkpoint
    location) `path`.

    A folder with a checkpoints/ subfolder is a run directory; so is any other existing folder that is not a
    checkpoint (no DCP .metadata, no meta.json, not named step-NNNNNNN). Returns (checkpoint folder, whether
    `path` was a run directory); a run directory without a complete checkpoint is a CheckpointUsageError naming it.
    A missing path is returned as is, for the caller to report.
    """
    if not exists(path):
        return path, False
    if is_checkpoint_folder(path):
        return path, False
    location = checkpoints_dir(path)
    latest, _ = latest_complete(path)
    if latest is None:
        unusable = list_checkpoints(path)
        if not exists(location):
            detail = f"{location} does not exist, and {path} is not a checkpoint folder either"
        elif unusable:
            names = ", ".join(storage_for(i.path).basename(i.path) + ("" if i.partial else " (no meta.json)")
                              for i in unusable)
            detail = f"{location} holds only incomplete ones: {names}"
        else:
            detail = f"{location} holds no step-NNNNNNN folder"
        raise CheckpointUsageError(path, f"run directory without a complete checkpoint ({detail})")
    latest, _ = newest_usable(path)  # a corrupt newer folder is an error, not a reason to fall back
    return latest.path, True


def file_manifest(path: str) -> dict[str, dict]:
    """{relative file: {bytes, crc32}} of every data file in a checkpoint folder (read back: a local one)."""
    storage = storage_for(path)
    return {name: {"bytes": size, "crc32": file_crc32(storage.join(path, name))}
            for name, size in sorted(storage.sizes(path).items()) if name != META}


def verify(path: str, crc: bool = True) -> dict:
    """Check every file against meta.json; a missing, truncated or (crc=True) altered file is an error naming
    it. The launcher checks CRCs once before starting; workers check sizes (cheap) on every (re)start."""
    storage = storage_for(path)
    meta = read_meta(path)
    if meta is None:
        raise CheckpointError(path, f"missing or unreadable {META}: not a complete checkpoint")
    sizes = storage.sizes(path)  # one listing, also on an object store
    if DCP_METADATA not in sizes:
        raise CheckpointError(storage.join(path, DCP_METADATA), "DCP's index of the shards is missing")
    for name, expect in meta.get("files", {}).items():
        full = storage.join(path, name)
        if name not in sizes:
            raise CheckpointError(full, "checkpoint file is missing")
        if sizes[name] != expect["bytes"]:
            raise CheckpointError(full, f"checkpoint file is truncated or altered: {sizes[name]} bytes, "
                                        f"{expect['bytes']} written")
        if crc and file_crc32(full) != expect["crc32"]:
            raise CheckpointError(full, "checkpoint file is corrupted (CRC32 differs from the one written)")
    return meta


def finalize(staged: str, meta: dict, written: dict[str, dict] | None = None) -> str:
    """Write meta.json (with the file manifest) into the staged folder and publish it under its final name.

    `written`: every rank's files with their sizes and CRC32s as counted while writing (an object store, where
    reading the shards back would cost a download); each must be there with its size before meta.json commits.
    Without it the files are read back (a filesystem)."""
    storage = storage_for(staged)
    if written is None:
        files = file_manifest(staged)
    else:
        sizes = storage.sizes(staged)
        for name, expect in written.items():
            if sizes.get(name) != expect["bytes"]:
                raise CheckpointError(storage.join(staged, name), f"written with {expect['bytes']} bytes, but the "
                                                                  f"store holds {sizes.get(name, 'no such file')}")
        extra = {name: size for name, size in sizes.items() if name not in written and name != META}
        files = {**dict(sorted(written.items())),
                 **{name: {"bytes": size, "crc32": file_crc32(storage.join(staged, name))}
                    for name, size in extra.items()}}  # config.yaml: small, read back
    return seal(staged, dict(meta, files=files))


def seal(staged: str, meta: dict) -> str:
    """Write meta.json (`meta` has its manifest already) into the staged folder and publish it."""
    storage = storage_for(staged)
    storage.write_bytes(storage.join(staged, META), json.dumps(meta, indent=1).encode())
    final = staged.removesuffix(".tmp")
    storage.publish(staged, final)
    return final


def prune(where, keep: int, protect: str | None = None, tier: str = STORE, hold: tuple[str, ...] = ()) -> list[str]:
    """In one tier: delete all but the newest `keep` complete checkpoints, and partial ones older than the newest
    complete.

    `protect` (the checkpoint just saved) is always kept and counts towards `keep`: a run directory can hold
    higher steps from an earlier attempt, which must not push the run's own newest save out. `hold`: folders kept
    besides (local copies not uploaded yet). Corrupt folders are left for the user to look at."""
    location = tiers_of(where).at(tier)
    infos = sorted(_list_at(location, tier), key=lambda i: (i.step, i.complete))
    complete = [i for i in infos if i.complete]
    doomed = _beyond_keep(complete, keep, protect) if keep else []
    newest = complete[-1].step if complete else None
    doomed += [i for i in infos if i.partial and newest is not None and i.step < newest]
    doomed = [i for i in doomed if _norm(i.path) not in {_norm(h) for h in hold}]
    storage = storage_for(location)
    for info in doomed:
        storage.remove(info.path)
    return [i.path for i in doomed]


def _norm(path: str) -> str:
    return path.rstrip("/")


def _beyond_keep(complete: list[CheckpointInfo], keep: int, protect: str | None) -> list[CheckpointInfo]:
    """The complete checkpoints (oldest first) that `keep` leaves out, never `protect`."""
    protect = _norm(protect) if protect else None
    others = [i for i in complete if _norm(i.path) != protect]
    slots = keep - (len(others) < len(complete))
    return others[: max(0, len(others) - slots)]


def remove_partials(where) -> list[str]:
    """Delete every partial folder of every tier: only safe while no save or upload is in flight (when a launch
    starts)."""
    doomed = [i.path for i in list_checkpoints(where) if i.partial]
    for path in doomed:
        storage_for(path).remove(path)
    return doomed


def check(info: CheckpointInfo) -> str | None:
    """Why a checkpoint folder cannot be resumed, or None: the launcher's checks short of the CRC32 (meta.json,
    DCP's .metadata, every file of the manifest present with its size)."""
    if info.partial:
        return None
    try:
        verify(info.path, crc=False)
    except CheckpointError as e:
        where = e.key[len(info.path):].lstrip("/") if e.key.startswith(info.path) else e.key
        return e.message if where in ("", ".") else f"{where}: {e.message}"
    return None


def file_crc32(path: str) -> int:
    crc = 0
    with storage_for(path).open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            crc = zlib.crc32(chunk, crc)
    return crc

