"""The backend a config names (cluster.name). Backends are imported here, lazily, so that they can import the base
interface without an import circle."""

from __future__ import annotations

import importlib

from omegaconf import DictConfig

from llmtrain.config.errors import ConfigError
from llmtrain.launch.backends.base import Backend

BACKENDS = {
    "local": ("llmtrain.launch.backends.local", "LocalBackend"),
    "ssh": ("llmtrain.launch.backends.ssh", "SSHBackend"),
    "slurm": ("llmtrain.launch.backends.slurm", "SlurmBackend"),
}


def get_backend(cfg: DictConfig, run_dir: str, worker_module: str = "llmtrain.worker") -> Backend:
    if cfg.cluster.name not in BACKENDS:
        raise ConfigError("cluster.name", f"unknown cluster backend '{cfg.cluster.name}' "
                                          f"(available: {', '.join(BACKENDS)})")
    module, name = BACKENDS[cfg.cluster.name]
    return getattr(importlib.import_module(module), name)(cfg, run_dir, worker_module)
