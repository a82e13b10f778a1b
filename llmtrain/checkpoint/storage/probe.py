"""Before a launch starts anything: can checkpoints be written where they go? One small object written, read back
and removed, so an unreachable endpoint, a missing bucket or a denied write is one line naming the location, not a
failed save an hour in."""

from __future__ import annotations

import os
import socket
import uuid

from llmtrain.checkpoint.storage import is_uri, storage_for
from llmtrain.checkpoint.storage.failures import describe

PROBE_PREFIX = ".llmtrain-probe-"
CONNECT_TIMEOUT_S = 10


def install_problem(location: str) -> str | None:
    """Why the client of `location`'s store is not installed here, or None (no network)."""
    if not is_uri(location):
        return None
    import fsspec

    protocol = location.split("://", 1)[0]
    try:
        fsspec.get_filesystem_class(protocol)
    except ImportError:
        package = {"gs": "gcsfs", "gcs": "gcsfs", "az": "adlfs", "abfs": "adlfs", "abfss": "adlfs"}.get(protocol)
        how = ("pip install 'llmtrain[s3]'" if protocol in ("s3", "s3a") else f"pip install {package}" if package
               else f"install fsspec's {protocol}:// filesystem package")
        return f"the {protocol}:// client is not installed: {how}"
    except ValueError:
        return f"unknown storage scheme {protocol}:// (fsspec knows none by that name)"
    return None


def _probe_filesystem(location: str):
    """The store's filesystem for the probe: one quick try, no minutes of retries against a dead endpoint."""
    from llmtrain.checkpoint.storage.object_store import filesystem

    protocol = location.split("://", 1)[0]
    if protocol in ("s3", "s3a"):
        return filesystem(location, config_kwargs={"connect_timeout": CONNECT_TIMEOUT_S,
                                                              "read_timeout": 30,
                                                              "retries": {"max_attempts": 1}})
    return filesystem(location)


def why_unwritable(location: str) -> str | None:
    """Why checkpoints cannot be written at `location`, in words that name it; None when the probe went through."""
    problem = install_problem(location)
    if problem:
        return problem
    name = f"{PROBE_PREFIX}{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    if not is_uri(location):
        storage = storage_for(location)
        try:
            storage.makedirs(location)
            storage.write_bytes(storage.join(location, name), b"llmtrain")
            storage.remove(storage.join(location, name))
        except OSError as e:
            return f"cannot write to {location}: {e.strerror or e}"
        return None
    fs = _probe_filesystem(location)
    key = fs._strip_protocol(location).rstrip("/") + "/" + name
    try:
        fs.pipe_file(key, b"llmtrain")
        if fs.cat_file(key) != b"llmtrain":
            return f"{location}: the probe object read back differs from what was written"
        fs.rm_file(key)
    except Exception as e:  # noqa: BLE001 - every client failure becomes one line
        return f"{location}: {describe(e)}"
    return None
