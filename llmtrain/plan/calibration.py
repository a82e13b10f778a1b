"""What `llmtrain tune` measured, fitted into the two factors of the plan's step time, per hardware profile and model
family: LLMTRAIN_CACHE/calibration.json (default ~/.cache/llmtrain/calibration.json).

The plan's step time is compute / efficiency + comm_factor x exposed communication, where compute is the step's
FLOPs at the device's peak (pipeline bubble included) and exposed communication the TP/PP transfers and the part
of DP that does not overlap with backward. The uncalibrated plan assumes the profile's efficiency (default 0.5)
and comm_factor 1. Each measured trial gives one equation, measured step time = compute x a + exposed x b; the
least-squares a and b (errors relative to the measured time, so small and large steps weigh alike) give
efficiency = 1 / a and comm_factor = b. Only tune writes the file (atomically); a re-measured layout replaces its
earlier point.
"""

from __future__ import annotations

import datetime
import json
import os
from dataclasses import dataclass

import numpy as np

from llmtrain.rundir.atomic import atomic_write_json

FILE_NAME = "calibration.json"
WARNING = "Written by `llmtrain tune`; do not edit by hand (a tune rewrites it). Delete it to plan uncalibrated."
MAX_POINTS = 64  # per profile and family: the newest ones


@dataclass(frozen=True)
class Calibration:
    efficiency: float
    comm_factor: float
    trials: int
    profile: str
    date: str

    def line(self) -> str:
        return f"calibrated from {self.trials} trials on {self.profile}, {self.date}"


def cache_dir() -> str:
    """The folder configs/data/stdlib.yaml keeps its corpus in too."""
    return os.environ.get("LLMTRAIN_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "llmtrain")


def path() -> str:
    return os.path.join(cache_dir(), FILE_NAME)


def family(model_cfg) -> str:
    """Which fitted family a model's timings join: its spec's `calibration` (GPT-2's gpt), else the family's name."""
    from llmtrain.model.registry import family_of

    spec = family_of(model_cfg)
    return spec.calibration or spec.name


def _read() -> dict:
    try:
        with open(path()) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) and isinstance(data.get("entries"), dict) else {}


def lookup(profile: str, model_family: str) -> Calibration | None:
    """The fitted factors for this profile and family; None when nothing was measured (or the file is unreadable:
    the plan then says what it assumes, as without a file)."""
    entry = _read().get("entries", {}).get(f"{profile}/{model_family}")
    try:
        fit = entry["fit"]
        return Calibration(float(fit["efficiency"]), float(fit["comm_factor"]), int(fit["trials"]), profile,
                           str(entry["updated"]))
    except (TypeError, KeyError, ValueError):
        return None


MIN_COMM_SHARE = 0.02  # exposed communication under this share of every measured step cannot be told from noise


def fit(points: list[dict], default_comm_factor: float = 1.0) -> tuple[float, float] | None:
    """(efficiency, comm_factor) from points {compute_s, comm_s, measured_step_s}; None when they fix nothing.
    Without exposed communication worth fitting in any point (MIN_COMM_SHARE), comm_factor keeps its default; a
    negative one becomes 0."""
    rows = [(p["compute_s"], p["comm_s"], p["measured_step_s"]) for p in points
            if p.get("measured_step_s", 0) > 0 and p.get("compute_s", 0) > 0]
    if not rows:
        return None
    a = np.array([[c / t, m / t] for c, m, t in rows])
    ones = np.ones(len(rows))
    comm_seen = bool(np.any(a[:, 1] * default_comm_factor >= MIN_COMM_SHARE))
    if comm_seen and len(rows) > 1:
        (x, y), *_ = np.linalg.lstsq(a, ones, rcond=None)
        if y >= 0 and x > 0:
            return float(1 / x), float(y)
    y = 0.0 if comm_seen else default_comm_factor
    x = float(np.dot(a[:, 0], ones - y * a[:, 1]) / np.dot(a[:, 0], a[:, 0]))
    return (1 / x, y) if x > 0 else None


def record(profile: str, model_family: str, new_points: list[dict], today: str | None = None) -> Calibration | None:
    """Add measured points (a point with the same `key` replaces the earlier one), refit, write the file
    atomically; the calibration now in force."""
    data = _read() or {"entries": {}}
    data["warning"] = WARNING
    name = f"{profile}/{model_family}"
    entry = data["entries"].get(name) or {"profile": profile, "family": model_family, "points": []}
    keys = {p["key"] for p in new_points}
    points = [p for p in entry.get("points", []) if p.get("key") not in keys] + new_points
    entry["points"] = points[-MAX_POINTS:]
    found = fit(entry["points"])
    if found is None:
        return lookup(profile, model_family)
    entry["updated"] = today or datetime.date.today().isoformat()
    entry["fit"] = {"efficiency": found[0], "comm_factor": found[1], "trials": len(entry["points"])}
    data["entries"][name] = entry
    _write(data)
    return Calibration(found[0], found[1], len(entry["points"]), profile, entry["updated"])


def _write(data: dict) -> None:
    target = path()
    os.makedirs(os.path.dirname(target), exist_ok=True)
    atomic_write_json(target, {"warning": data.pop("warning"), **data}, indent=1)
