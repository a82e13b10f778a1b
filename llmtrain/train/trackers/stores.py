"""Whether the enabled trackers' stores can take a run, checked by the launcher before anything is written.

A store that cannot (an unwritable SQLite file or folder, a tracking server nobody answers at) would otherwise
stall rank 0's start-up, MLflow retrying for minutes, while every other rank waits for it in a collective.
"""

from __future__ import annotations

import os
import socket
import tempfile
from urllib.parse import urlparse

from omegaconf import DictConfig

from llmtrain.config.errors import ConfigError
from llmtrain.rundir.paths import RunPaths

CONNECT_TIMEOUT_S = 5.0
MLFLOW_SCHEMES = ("", "file", "http", "https", "databricks")
MLFLOW_DATABASES = ("sqlite", "postgresql", "mysql", "mssql")
UNITY_CATALOG = ("databricks-uc", "uc")
_OFF = "or set {key}=false to train without it"


def check_tracker_stores(cfg: DictConfig) -> None:
    """Refuse (ConfigError naming the key) a tracker whose store cannot be written or reached from here."""
    run_dir = os.path.abspath(cfg.run.dir)
    if cfg.logging.mlflow:
        _check_mlflow(cfg.logging.mlflow_tracking_uri, run_dir)
    if cfg.logging.wandb:
        why = _unwritable_folder(RunPaths(run_dir).wandb)
        if why:
            raise ConfigError("logging.wandb", f"W&B cannot write its files: {why}; {_OFF.format(key='logging.wandb')}")


def _check_mlflow(uri: str | None, run_dir: str) -> None:
    key = "logging.mlflow_tracking_uri" if uri else "logging.mlflow"
    fix = f"pick a writable place ({'logging.mlflow_tracking_uri' if uri else 'run.dir'}) " + \
        _OFF.format(key="logging.mlflow")
    if not uri:
        why = _unwritable_file(RunPaths(run_dir).mlflow_db)
    else:
        unknown = untrackable_scheme(uri)
        if unknown:  # refused now: MLflow would be switched off once the run has started
            raise ConfigError(key, f"{unknown}; fix the URI " + _OFF.format(key="logging.mlflow"))
        scheme = urlparse(uri).scheme
        if scheme in ("http", "https"):
            _check_reachable(uri)
            return
        if scheme == "sqlite":
            path = uri[len("sqlite:///"):]
            why = _unwritable_file(path) if path and path != ":memory:" else None
        elif scheme in ("", "file") and uri != "databricks":  # MLflow's file store: a folder
            why = _unwritable_folder(urlparse(uri).path if scheme else uri)
        else:
            return  # a database server or a hosted service: asked when the run starts
    if why:
        raise ConfigError(key, f"MLflow's store cannot be written: {why}; {fix}")


def untrackable_scheme(uri: str) -> str | None:
    """Why MLflow's client has no tracking store for `uri`'s scheme, or None. The schemes are MLflow's own
    (mlflow.tracking._tracking_service.utils: a path or file://, http(s)://, databricks, the SQLAlchemy databases of
    mlflow.store.db.db_types with an optional +driver, and plugins' `mlflow.tracking_store` entry points; Unity
    Catalog's `databricks-uc` and `uc` are registry URIs it refuses to track to), named here because importing
    mlflow takes seconds."""
    scheme = uri if uri in ("databricks", *UNITY_CATALOG) else urlparse(uri).scheme
    database, _, driver = scheme.partition("+")
    if scheme in MLFLOW_SCHEMES or len(scheme) == 1:  # a one-letter scheme is a Windows drive: a path
        return None
    if database in MLFLOW_DATABASES and "+" not in driver:
        return None
    plugins = _plugin_schemes()
    if scheme in plugins and scheme not in UNITY_CATALOG:
        return None
    return (f"MLflow has no tracking store for the scheme {scheme}: of {uri}; it tracks to a path or file://, "
            f"http:// or https://, databricks, or a database ({', '.join(d + '://' for d in MLFLOW_DATABASES)}, "
            "each with an optional +driver)" + (f", or a plugin's scheme ({', '.join(sorted(plugins))})" if plugins else ""))


def _plugin_schemes() -> set[str]:
    from importlib.metadata import entry_points

    return {ep.name for ep in entry_points(group="mlflow.tracking_store")}


def _check_reachable(uri: str) -> None:
    parsed = urlparse(uri)
    try:
        port = parsed.port or (443 if parsed.scheme == "https" else 80)
        with socket.create_connection((parsed.hostname or "", port), timeout=CONNECT_TIMEOUT_S):
            return
    except (OSError, ValueError) as e:
        reason = getattr(e, "strerror", None) or str(e) or type(e).__name__
    raise ConfigError("logging.mlflow_tracking_uri", f"the MLflow tracking server {uri} does not answer from here "
                                                     f"within {CONNECT_TIMEOUT_S:g} s ({reason}); start it, fix the "
                                                     "URI, " + _OFF.format(key="logging.mlflow"))


def _unwritable_file(path: str) -> str | None:
    """Why a file at `path` (SQLite also writes a journal next to it) cannot be written, or None."""
    path = os.path.abspath(path)
    if os.path.isdir(path):
        return f"{path} is a folder"
    if os.path.exists(path):
        try:
            open(path, "ab").close()  # opened for writing, changed in nothing
        except OSError as e:
            return f"cannot write {path} ({e.strerror or e})"
    return _unwritable_folder(os.path.dirname(path))


def _unwritable_folder(folder: str) -> str | None:
    """Why files cannot be created in `folder` (or, when it does not exist yet, in the nearest folder above it
    that does), or None. Tried for real: permission bits do not tell for root or a read-only mount."""
    folder = os.path.abspath(folder)
    existing = folder
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        return f"{existing} is not a folder" + (f" (in the path {folder})" if existing != folder else "")
    try:
        fd, probe = tempfile.mkstemp(dir=existing, prefix=".llmtrain-probe-")
        os.close(fd)
        os.remove(probe)
    except OSError as e:
        return f"cannot create files in {existing} ({e.strerror or e})"
    return None
