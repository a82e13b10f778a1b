"""Session fixture `cluster`: a real two-node Slurm + ssh cluster from network namespaces (scripts/testcluster.sh).

conftest.py imports it once, so every test module shares one instance (importing it into two modules would start two). The nodes `node1`/`node2` share
this machine's filesystem, so they run the same Python from the same working directory. Skips when the script exits
77 (not root, no network namespaces); fails on any other setup error. The cluster is torn down at session end.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "testcluster.sh"
NODES = ("node1", "node2")


@dataclass
class Cluster:
    state_dir: Path
    ssh_config: Path
    slurm_conf: Path
    env: dict[str, str] = field(default_factory=dict)   # variables to add to a command's environment
    nodes: tuple[str, ...] = NODES

    def environ(self, **extra: str) -> dict[str, str]:
        """os.environ plus the cluster's variables (SLURM_CONF, LLMTRAIN_SSH_CONFIG) plus `extra`."""
        return {**os.environ, **self.env, **extra}

    def ssh_argv(self, node: str, command: str) -> list[str]:
        return ["ssh", "-F", str(self.ssh_config), node, command]

    def ssh(self, node: str, command: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(self.ssh_argv(node, command), capture_output=True, text=True, timeout=timeout)


def _script(action: str, state_dir: Path, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), action, str(state_dir)], capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="session")
def cluster():
    # Short path under /tmp: the munge socket lives in the state dir and unix socket paths are limited to 108 bytes.
    state_dir = Path(tempfile.mkdtemp(prefix="llmt-tc-", dir="/tmp"))
    try:
        up = _script("up", state_dir, timeout=600)   # may include apt installs on a fresh machine
    except subprocess.TimeoutExpired as e:
        _script("down", state_dir, timeout=120)
        pytest.fail(f"testcluster up timed out:\n{e.stdout}\n{e.stderr}")
    if up.returncode == 77:
        shutil.rmtree(state_dir, ignore_errors=True)
        reason = (up.stderr.strip().splitlines() or ["testcluster unavailable"])[-1]
        pytest.skip(reason)
    if up.returncode != 0:
        _script("down", state_dir, timeout=120)
        pytest.fail(f"testcluster up failed ({up.returncode}):\n{up.stdout[-3000:]}\n{up.stderr[-5000:]}")
    c = Cluster(state_dir=state_dir, ssh_config=state_dir / "ssh_config", slurm_conf=state_dir / "slurm.conf")
    c.env = {"SLURM_CONF": str(c.slurm_conf), "LLMTRAIN_SSH_CONFIG": str(c.ssh_config)}
    try:
        yield c
    finally:
        down = _script("down", state_dir, timeout=120)
        if down.returncode == 0:
            shutil.rmtree(state_dir, ignore_errors=True)
        else:
            print(f"testcluster down failed ({down.returncode}); state kept in {state_dir}:\n{down.stderr}")
