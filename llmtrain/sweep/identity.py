"""Which sweep a sweep directory holds, so that a command adds to its own sweep and never overwrites another.

A sweep is its swept keys, its other overrides and its config folders; not the values swept. The same command
with more values extends the sweep, and a run is found again by its values, whatever its position in the
command: the folder sweep.yaml recorded for them (which also finds folders named `<index>-<values>` by earlier
versions of llmtrain), else one named by the values (expand.run_dir_name)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Sequence

from llmtrain.config.errors import ConfigError
from llmtrain.sweep import record
from llmtrain.sweep.expand import Combination


@dataclass
class EarlierSweep:
    """What sweep.yaml recorded of the sweep in a directory; no runs when there is none yet."""

    dir: str
    runs: list[dict] = field(default_factory=list)

    def dir_name(self, combination: Combination) -> str:
        """The run's folder: the one recorded for these values, else one named by them."""
        values = _values(combination.swept)
        for run in self.runs:
            if _values(run.get("params")) == values:
                return str(run["dir"])
        return combination.dir_name


def earlier_sweep(sweep_dir: str, first: Combination, config_dirs: Sequence[str]) -> EarlierSweep:
    """The sweep recorded in sweep_dir, when it is this command's sweep (with the same or other values);
    ConfigError naming the folder when it is another one, before anything is written."""
    data = record.read(sweep_dir)
    if data is None:
        return EarlierSweep(sweep_dir)
    runs = [run for run in data["runs"] if isinstance(run, dict) and run.get("dir")]
    differs = _difference(data, runs, first, config_dirs)
    if differs:
        raise ConfigError("run.dir", f"{sweep_dir} holds another sweep ({differs}); nothing was started or "
                                     f"written: give run.dir={_free_dir(sweep_dir)} for a new sweep (more values "
                                     "of the same keys, with the same other overrides, extend that one)")
    return EarlierSweep(sweep_dir, runs)


def _difference(data: dict, runs: list[dict], first: Combination, config_dirs: Sequence[str]) -> str | None:
    then_keys = sorted(str(key) for key in data.get("swept") or [])
    now_keys = sorted(first.swept)
    if then_keys != now_keys:
        return f"it sweeps {_listed(then_keys)}, this command {_listed(now_keys)}"
    recorded = _overrides_of(runs)  # a run's overrides: the sweep's fixed ones and its own values
    then = sorted(_fixed(recorded, then_keys)) if recorded is not None else None
    now = sorted(_fixed(first.fixed, now_keys))
    if then is not None and then != now:
        return (f"its other overrides {_listed([o for o in then if o not in now])} are "
                f"{_listed([o for o in now if o not in then])} here")
    then_dirs = [str(d) for d in data.get("config_dirs") or []]
    if then_dirs != list(config_dirs):
        return f"its --config-dir {_listed(then_dirs)} is {_listed(list(config_dirs))} here"
    return None


def _overrides_of(runs: list[dict]) -> list[str] | None:
    overrides = runs[0].get("overrides") if runs else None
    return [str(o) for o in overrides] if isinstance(overrides, list) else None


def _fixed(overrides: Sequence[str], swept: Sequence[str]) -> list[str]:
    """The overrides of one value, without run.dir (which only says where the sweep is)."""
    return [o for o in overrides if _key(o) not in swept and _key(o) != "run.dir"]


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def _values(params) -> dict[str, str]:
    return {str(k): str(v) for k, v in params.items()} if isinstance(params, dict) else {}


def _listed(items: Sequence[str]) -> str:
    return " ".join(items) if items else "none"


def _free_dir(sweep_dir: str) -> str:
    """A sibling folder name not taken yet: <sweep dir>-2, -3, ..."""
    n = 2
    while os.path.exists(f"{sweep_dir}-{n}"):
        n += 1
    return f"{sweep_dir}-{n}"
