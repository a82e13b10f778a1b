"""A sweep before anything starts: every combination composed and validated, its run directory decided.

In a sweep run.dir names the sweep directory (default: the first combination's run.dir + "-sweep", that is
runs/<run.name>-sweep); each run goes to a folder of it named by its swept values (identity.py: found again when
the sweep gains values) and gets the sweep directory's name in its workers' environment (SWEEP_NAME_VAR, through
the config's env mapping). A directory that holds another sweep is refused."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from omegaconf import DictConfig

from llmtrain.config.errors import ConfigError
from llmtrain.data.errors import DataError
from llmtrain.launch.backends.traits import traits_of
from llmtrain.sweep import SWEEP_NAME_VAR
from llmtrain.sweep.expand import Combination, expand
from llmtrain.sweep.identity import earlier_sweep


@dataclass
class SweepRun:
    combination: Combination
    cfg: DictConfig  # composed, validated, run.dir set to this run's directory

    @property
    def dir(self) -> str:
        return self.cfg.run.dir

    @property
    def name(self) -> str:
        return os.path.basename(self.cfg.run.dir)


@dataclass
class SweepPlan:
    dir: str
    overrides: list[str]  # as given on the command line
    config_dirs: list[str]
    runs: list[SweepRun]
    recorded: list[dict]  # the runs sweep.yaml already lists (an earlier command of this sweep); sweep.yaml keeps them

    @property
    def name(self) -> str:
        return os.path.basename(self.dir)

    @property
    def swept_keys(self) -> list[str]:
        return list(self.runs[0].combination.swept) if self.runs else []

    @property
    def backend(self) -> str:
        return self.runs[0].cfg.cluster.name


def plan_sweep(overrides: Sequence[str], config_dirs: Sequence[str] = ()) -> SweepPlan:
    """Compose and validate every combination; ConfigError (one line naming the combination and the key) for the
    first one that is refused, before anything is written."""
    from llmtrain.config import builtin_config_dir
    from llmtrain.launch.config_probes import compose_here, validate_here

    dirs = [builtin_config_dir(), *(Path(d).expanduser().resolve() for d in config_dirs)]
    combinations = expand(overrides, dirs)
    with naming_the_run(combinations[0].dir_name):
        sweep_dir = _sweep_dir(compose_here(combinations[0].overrides, config_dirs), overrides)
    earlier = earlier_sweep(sweep_dir, combinations[0], list(config_dirs))
    runs = []
    for combination in combinations:
        with naming_the_run(combination.dir_name):
            cfg = compose_here(combination.overrides, config_dirs)
            cfg.run.dir = os.path.join(sweep_dir, earlier.dir_name(combination))
            cfg.env[SWEEP_NAME_VAR] = os.path.basename(sweep_dir)
            if traits_of(cfg.cluster.name).queued:
                cfg.cluster.follow = False  # every run is submitted at once; following one would hold the rest
                if not cfg.cluster.job_name:  # squeue tells the runs apart
                    cfg.cluster.job_name = f"llmtrain-{os.path.basename(sweep_dir)}-{combination.index}"
            validate_here(cfg)
        runs.append(SweepRun(combination, cfg))
    return SweepPlan(sweep_dir, list(overrides), list(config_dirs), runs, earlier.runs)


@contextlib.contextmanager
def naming_the_run(name: str):
    """A refused config says which combination it is: the key, the rule, then the run."""
    try:
        yield
    except (ConfigError, DataError) as e:
        raise ConfigError(e.key, f"{e.message} (in sweep run {name})") from None


def _sweep_dir(cfg: DictConfig, overrides: Sequence[str]) -> str:
    """run.dir when given, else the run directory a single run would get, + "-sweep"."""
    given = any(o.split("=", 1)[0].lstrip("+~") == "run.dir" for o in overrides)
    return os.path.abspath(cfg.run.dir if given else f"{cfg.run.dir}-sweep")
