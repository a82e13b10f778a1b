"""The timed-collective bench scripts (scripts/bench_ep_cpu.py, scripts/bench_cp_cpu.py) loaded by path for their
unit tests, and a stand-in clock for their StepClocks."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def load(name: str) -> ModuleType:
    """scripts/NAME.py as a module (scripts/ is no package; the script puts its folder on sys.path itself, for
    the harness it imports)."""
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fake_clock(clock_class, times: list[float]):
    """clock_class(now=...) whose now() returns `times` in turn."""
    ticks = iter(times)
    return clock_class(now=lambda: next(ticks))
