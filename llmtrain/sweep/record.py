"""SWEEP_DIR/sweep.yaml: the sweep's combinations and where each run went, written atomically before the first
run starts. A re-run of the same command writes the same file; one with more values adds their runs after those
already listed (a run is never dropped from it). `llmtrain compare SWEEP_DIR` reads it."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from omegaconf import OmegaConf

from llmtrain.config.errors import ConfigError
from llmtrain.sweep import SWEEP_FILE
from llmtrain.rundir.atomic import atomic_write_text

if TYPE_CHECKING:  # plan.py reads sweep.yaml (through identity.py) before it plans
    from llmtrain.sweep.plan import SweepPlan


def sweep_file(sweep_dir: str) -> str:
    return os.path.join(sweep_dir, SWEEP_FILE)


def content(plan: SweepPlan) -> dict:
    return {
        "sweep": plan.name,
        "overrides": plan.overrides,
        "config_dirs": plan.config_dirs,
        "swept": plan.swept_keys,
        "backend": plan.backend,
        # dir: relative to the sweep directory, so a moved sweep directory still finds its runs.
        "runs": [{"index": index, **run} for index, run in enumerate(_runs(plan))],
    }


def _runs(plan: SweepPlan) -> list[dict]:
    """The runs listed before, then this command's new ones (index: the position in this list)."""
    runs = [{k: v for k, v in run.items() if k != "index"} for run in plan.recorded]
    listed = {str(run.get("dir")) for run in runs}
    return runs + [{"dir": run.name, "params": dict(run.combination.swept),
                    "overrides": list(run.combination.overrides)} for run in plan.runs if run.name not in listed]


def write(plan: SweepPlan) -> str:
    """Create the sweep directory and write sweep.yaml; ConfigError when it cannot be written (nothing is left
    half-written)."""
    path = sweep_file(plan.dir)
    try:
        os.makedirs(plan.dir, exist_ok=True)
        atomic_write_text(path, OmegaConf.to_yaml(content(plan)))
    except OSError as e:
        raise ConfigError("run.dir", f"cannot write the sweep directory {plan.dir}: {e.strerror or e}") from None
    return path


def read(sweep_dir: str) -> dict | None:
    """sweep.yaml of a directory as a dict; None when the directory holds none. ConfigError when unreadable."""
    path = sweep_file(sweep_dir)
    if not os.path.isfile(path):
        return None
    try:
        data = OmegaConf.to_container(OmegaConf.load(path))
    except Exception as e:  # yaml and omegaconf raise several types; all mean the same here
        raise ConfigError(path, f"unreadable sweep file: {str(e).strip().splitlines()[0]}") from None
    if not isinstance(data, dict) or not isinstance(data.get("runs"), list):
        raise ConfigError(path, "not a sweep file: no list of runs")
    return data


def run_dirs(sweep_dir: str, data: dict) -> list[str]:
    """The runs' directories, in the sweep's order."""
    return [os.path.join(os.path.abspath(sweep_dir), str(run.get("dir"))) for run in data["runs"]
            if isinstance(run, dict) and run.get("dir")]
