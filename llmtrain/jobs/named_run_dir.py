"""A run directory named on the command line: it must exist and hold the config.yaml its launch wrote."""

from __future__ import annotations

import os

from llmtrain.config.errors import ConfigError
from llmtrain.rundir.paths import RunPaths


def load(path: str):
    """(absolute run directory, its config); ConfigError (one line, exit 2) when it is not a run directory."""
    run_dir = os.path.abspath(path)
    if not os.path.isdir(run_dir):
        raise ConfigError("RUN_DIR", f"no such run directory: {path}")
    config = RunPaths(run_dir).config
    if not os.path.isfile(config):
        raise ConfigError("RUN_DIR", f"{path} holds no config.yaml: not a run directory (llmtrain launch writes "
                                     "one there)")
    from llmtrain.config import load_run_config

    return run_dir, load_run_config(config)
