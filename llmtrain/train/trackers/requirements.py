"""Whether a tracker's package is installed, looked up without importing it (the launcher checks before launch)."""

from __future__ import annotations

from llmtrain.extras import missing_extra

# Config key -> the package it needs, which is also the name of the extra that installs it.
PACKAGES = {"logging.wandb": "wandb", "logging.mlflow": "mlflow"}


def tracker_missing(key: str) -> str | None:
    """Why the tracker that `key` turns on cannot run here, or None."""
    return missing_extra(PACKAGES[key])
