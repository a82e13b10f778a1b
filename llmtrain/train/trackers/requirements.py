"""Whether a tracker's package is installed, looked up without importing it (the launcher checks before launch)."""

from __future__ import annotations

from importlib.util import find_spec

# Config key -> the package it needs, which is also the name of the extra that installs it.
PACKAGES = {"logging.wandb": "wandb", "logging.mlflow": "mlflow"}


def tracker_missing(key: str) -> str | None:
    """Why the tracker that `key` turns on cannot run here, or None."""
    package = PACKAGES[key]
    if find_spec(package) is None:
        return (f"needs the {package} package, which is not installed: pip install 'llmtrain[{package}]' "
                f"(in a checkout: pip install -e '.[{package}]')")
    return None
