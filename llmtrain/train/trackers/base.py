"""The interface every tracker implements, and the scalars a metrics row becomes."""

from __future__ import annotations

import math
import numbers

# Set by a sweep in every run it launches: the runs of one sweep are grouped under this name.
SWEEP_NAME_ENV = "LLMTRAIN_SWEEP_NAME"
# How a launch ended, as finish() is told.
STATUSES = ("finished", "failed", "preempted")


class Tracker:
    """One experiment tracker for one launch: start, a log call per metrics row, finish."""

    name = ""  # its entry in RUN_DIR/trackers.json
    key = ""  # the config key that turns it on
    title = ""  # its name in messages

    def start(self, config: dict, run_dir: str, resume_id: str | None) -> str:
        """Open the tracker run (continue `resume_id` when given) with the resolved config; return its id."""
        raise NotImplementedError

    def log(self, row: dict) -> None:
        """One metrics row (a train or val row), at the row's step."""
        raise NotImplementedError

    def finish(self, status: str) -> None:
        """End the tracker run with the launch's status, one of STATUSES."""
        raise NotImplementedError


# A data=mix row's per-source dicts become one scalar per source under these prefixes.
PER_SOURCE = {"source_tokens": "source_tokens/", "source_val_loss": "val_loss/"}
# A MoE row's per-layer lists become one scalar per sparse layer, named by its global index (the row's moe_layers).
PER_LAYER = {"expert_load": "expert_load/layer_", "experts_idle": "experts_idle/layer_", "ep_load": "ep_load/layer_"}
# Scalars named as they are, without the train/ or val/ prefix.
UNPREFIXED = ("data_wait_ms",)


def _finite_number(value) -> bool:
    return not isinstance(value, bool) and isinstance(value, numbers.Real) and math.isfinite(value)


def scalars(row: dict) -> dict[str, float]:
    """A row's numbers under the names TensorBoard also gets (train/loss, val/loss, data_wait_ms,
    source_tokens/<name>, val_loss/<name>, expert_load/layer_<i>, ...); the step is the x-axis, and missing or
    non-finite values are left out."""
    prefix = "val/" if "val_loss" in row else "train/"
    out = {}
    for key, value in row.items():
        if key in PER_SOURCE and isinstance(value, dict):
            out.update({PER_SOURCE[key] + str(name): v for name, v in value.items() if _finite_number(v)})
        elif key in PER_LAYER and isinstance(value, list):
            layers = row.get("moe_layers") or []
            out.update({PER_LAYER[key] + str(i): v for i, v in zip(layers, value) if _finite_number(v)})
        elif key != "step" and _finite_number(value):
            out[key if key in UNPREFIXED else prefix + key.replace("val_", "")] = value
    return out
