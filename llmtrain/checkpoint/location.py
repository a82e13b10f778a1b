"""Where a run's checkpoints are: `checkpoint.dir` (RUN_DIR/checkpoints when null; a path or an object-store URI)
and the optional fast tier `checkpoint.local_dir`. Code that has the config asks with it; code that has only a run
directory (status, the ckpt commands, a requeue) reads the run's config.yaml; a URI given alone is its own store."""

from __future__ import annotations

import os
from dataclasses import dataclass

from omegaconf import DictConfig, OmegaConf

from llmtrain.checkpoint.storage import is_uri, local_path
from llmtrain.rundir.paths import CONFIG, RunPaths

# The tiers, as `ckpt list` names them: where checkpoints are kept, and the fast copy (checkpoint.local_dir).
STORE = "store"
LOCAL = "local"


@dataclass(frozen=True)
class Tiers:
    store: str  # checkpoint.dir, else RUN_DIR/checkpoints
    local: str | None = None  # checkpoint.local_dir

    def each(self) -> list[tuple[str, str]]:
        """(tier, location) for every tier there is."""
        return [(STORE, self.store)] + ([(LOCAL, self.local)] if self.local else [])

    def at(self, tier: str) -> str:
        return self.local if tier == LOCAL and self.local else self.store


def _absolute(location: str) -> str:
    return location if is_uri(location) else os.path.abspath(os.path.expanduser(local_path(location)))


def tiers_of_config(cfg: DictConfig, run_dir: str | None = None) -> Tiers:
    ckpt = cfg.checkpoint
    run_dir = run_dir or os.path.abspath(cfg.run.dir)
    store = ckpt.get("dir") or RunPaths(run_dir).checkpoints
    local = ckpt.get("local_dir")
    return Tiers(_absolute(store), _absolute(local) if local else None)


def absolute_locations(cfg: DictConfig) -> None:
    """checkpoint.dir and checkpoint.local_dir as absolute paths (URIs as they are), in place: config.yaml must
    name the same folders for every process, whatever its working directory."""
    for key in ("dir", "local_dir"):
        if cfg.checkpoint.get(key):
            cfg.checkpoint[key] = _absolute(cfg.checkpoint[key])


_read: dict[str, tuple[int, Tiers]] = {}


def tiers_of(where: str | DictConfig | Tiers) -> Tiers:
    """The tiers of a config, of a run directory (its config.yaml; RUN_DIR/checkpoints without one), or of a
    location given as a URI."""
    if isinstance(where, Tiers):
        return where
    if isinstance(where, DictConfig):
        return tiers_of_config(where)
    if is_uri(where):
        return Tiers(where.rstrip("/"))
    run_dir = local_path(where)
    config = os.path.join(run_dir, CONFIG)
    try:
        stamp = os.stat(config).st_mtime_ns
    except OSError:
        return Tiers(RunPaths(run_dir).checkpoints)
    if _read.get(config, (None,))[0] != stamp:
        try:
            cfg = OmegaConf.load(config)
            tiers = tiers_of_config(cfg, run_dir) if "checkpoint" in cfg else Tiers(RunPaths(run_dir).checkpoints)
        except Exception:  # a damaged config.yaml is reported by whoever reads it for the run
            tiers = Tiers(RunPaths(run_dir).checkpoints)
        _read[config] = (stamp, tiers)
    return _read[config][1]
