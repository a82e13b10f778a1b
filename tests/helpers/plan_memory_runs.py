"""scripts/bench_plan_memory.py's comparison run in this process: the plan from plan_for, the training on forked
ranks (helpers.inprocess_run), instead of the CLI the script itself uses."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from llmtrain.config import compose_config
from llmtrain.launch.config_probes import validate_here

REPO = Path(__file__).resolve().parents[2]


def bench_module():
    spec = importlib.util.spec_from_file_location("bench_plan_memory", REPO / "scripts" / "bench_plan_memory.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def plan_here(overrides: list[str]) -> dict:
    """`llmtrain plan --json`'s output, computed in this process."""
    from llmtrain.plan.cli import plan_for

    cfg = compose_config(overrides)
    validate_here(cfg)
    return json.loads(json.dumps(plan_for(cfg).to_dict(), default=str))


def train_here(run_dir: str, overrides: list[str]) -> None:
    from helpers.inprocess_run import train_in_process

    train_in_process(run_dir, *overrides)
