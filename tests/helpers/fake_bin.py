"""An executable stand-in for a tool (srun, enroot, ssh ...) on a test's PATH."""

from __future__ import annotations

from pathlib import Path


def _fake_bin(directory: Path, name: str, body: str) -> Path:
    directory.mkdir(exist_ok=True)
    path = directory / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path
