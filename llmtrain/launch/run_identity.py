"""A run directory holds one run. A launch that would start a different run in a used directory is refused, or,
with run.overwrite=true, the earlier run is moved aside into RUN_DIR/previous/<time>/ (nothing is deleted).

A different run: checkpoint.resume=none over existing checkpoints; resuming with another model shape or seed, or
with other data than the checkpoint recorded (data/identity.py: a token file replaced in place included); a
checkpoint of another run directory resumed into this one; or rolling back to a checkpoint older than the newest
(the newer ones are what would be moved aside, since the run's later saves and pruning would mix with them).
"""

from __future__ import annotations

import os
import shutil
import time

from omegaconf import DictConfig

from llmtrain.checkpoint import store
from llmtrain.checkpoint.location import tiers_of, tiers_of_config
from llmtrain.checkpoint.storage import storage_for
from llmtrain.checkpoint.diff import config_diff, shape_keys
from llmtrain.config.errors import ConfigError
from llmtrain.data.identity import data_changes
from llmtrain.rundir.paths import METRICS, PREVIOUS, RUN_FILES, RunPaths


def conflict(cfg: DictConfig, run_dir: str, resume_path: str | None, old_cfg: DictConfig | None) -> tuple[str, list]:
    """(why this launch would start a different run, the checkpoints to move aside), or ("", [])."""
    tiers = tiers_of_config(cfg, run_dir)  # this launch's locations, not those of the config.yaml it replaces
    newest, _ = store.latest_complete(tiers)
    if newest is None:
        return "", []
    every = [i.path for i in store.list_checkpoints(tiers)]
    if resume_path is None:
        return (f"checkpoint.resume=none would start a new run in {run_dir}, which holds the run saved in "
                f"{newest.path}"), every
    storage = storage_for(resume_path)
    inside = storage.parent(resume_path) in {location for _, location in tiers.each()}
    if not inside:
        return (f"{resume_path} belongs to another run directory, and {run_dir} holds its own run (newest "
                f"{newest.path})"), every
    step = (store.read_meta(resume_path) or {}).get("step", 0)
    # Partial saves (.tmp) newer than it are ignored as ever; only complete checkpoints would be superseded.
    newer = [i.path for i in store.list_checkpoints(tiers) if i.complete and i.step > step]
    if newer:
        return (f"resuming from step {step} in {run_dir}, which holds newer checkpoints "
                f"({', '.join(storage_for(p).basename(p) for p in newer)})"), newer
    if old_cfg is not None and resume_path == newest.path:
        identity = shape_keys(cfg) + ("train.seed",)
        changed = [(k, a, b) for k, a, b in config_diff(old_cfg, cfg) if k in identity]
        what = ", ".join(f"{k} {a} -> {b}" for k, a, b in changed)
        data = data_changes((store.read_meta(resume_path) or {}).get("data"), cfg.data)
        if data:
            colon = ":" if cfg.data.name == "mix" else ""  # a mixture's changes begin with their source's name
            what = (what + ", " if what else "") + f"other data ({data_key(cfg)}{colon} {data})"
        if what:
            return f"{what} would start a new run in {run_dir}, which holds the run saved in {newest.path}", every
    return "", []


def moved_location(cfg: DictConfig, run_dir: str, resume_value: str) -> None:
    """checkpoint.dir changed for a run whose checkpoints are at the old location, and auto would find none at the
    new one: starting afresh there would silently drop the run. Refused, naming both locations."""
    before, now = tiers_of(run_dir), tiers_of_config(cfg, run_dir)
    if resume_value != "auto" or before.store == now.store or store.latest_complete(now)[0] is not None:
        return
    newest, _ = store.latest_complete(before)
    if newest is not None:
        raise ConfigError("checkpoint.dir", f"{now.store} holds no checkpoint of this run, whose newest is "
                                            f"{newest.path} (checkpoint.dir was {before.store}); copy the "
                                            "checkpoints there, resume from one with checkpoint.resume=PATH, or "
                                            "start afresh with run.overwrite=true checkpoint.resume=none")


def data_key(cfg: DictConfig) -> str:
    """The key that names the data: data.sources for a mixture, else data.path."""
    return "data.sources" if cfg.data.name == "mix" else "data.path"


def refuse_or_move_aside(cfg: DictConfig, run_dir: str, why: str, checkpoints: list[str]) -> str:
    """Raise ConfigError naming the ways forward, or (run.overwrite=true) move the earlier run aside and say
    where. Only the given checkpoints move (a rollback keeps the one it resumes); the run's files move whole."""
    if not cfg.run.overwrite:
        raise ConfigError("run.dir", f"{why}; use another run.dir, or run.overwrite=true to move the earlier run "
                                     f"aside into {RunPaths(run_dir).previous}/ (nothing is deleted)")
    dest = os.path.join(RunPaths(run_dir).previous, time.strftime("%Y%m%d-%H%M%S"))
    while os.path.exists(dest):
        dest += "+"
    aside = RunPaths(dest)
    os.makedirs(aside.checkpoints)
    for path in checkpoints:
        # One kept elsewhere (checkpoint.dir, local_dir) goes to previous/<time>/ beside it: an object store or
        # another filesystem cannot take it into the run directory.
        storage = storage_for(path)
        parent = storage.parent(path)
        into = aside.checkpoints if parent == RunPaths(run_dir).checkpoints else \
            storage.join(parent, PREVIOUS, os.path.basename(dest))
        try:
            storage.move(path, storage.join(into, storage.basename(path)))
        except OSError as e:
            raise ConfigError("run.overwrite", f"cannot move {path} aside into {into}: {e.strerror or e}") from None
    everything = not store.list_checkpoints(tiers_of_config(cfg, run_dir))
    for name in RUN_FILES:
        src = os.path.join(run_dir, name)
        if not os.path.exists(src):
            continue
        if everything:
            os.rename(src, os.path.join(dest, name))
        elif name == METRICS:
            shutil.copy2(src, os.path.join(dest, name))  # a rollback keeps its history up to the step it resumes
    return f"run.overwrite=true: moved the earlier run ({len(checkpoints)} checkpoint(s)) to {dest}"
