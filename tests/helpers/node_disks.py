"""Ranks that each run as a node of their own with a node-local disk: a rank forked by helpers.ranks takes
GROUP_RANK = its rank (one rank per node) and a private mount namespace in which its own folder is bind-mounted
over the fast tier's path, so two ranks on one machine see two different disks at the same path, as two nodes do.
Needs root and mount namespaces (unshare); `unavailable()` says why not, for a skip."""

from __future__ import annotations

import ctypes
import os
import subprocess

CLONE_NEWNS = 0x00020000


def unavailable() -> str | None:
    if os.geteuid() != 0:
        return "node-local disks are simulated with mount namespaces, which need root"
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"mount namespaces are unavailable here (unshare -m: {probe.stderr.strip()[:200]})"
    return None


def own_disk(disk: str, path: str) -> None:
    """This process (and its children) sees `disk` at `path`; nobody else does."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWNS) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNS)")
    subprocess.run(["mount", "--make-rprivate", "/"], check=True)
    os.makedirs(disk, exist_ok=True)
    os.makedirs(path, exist_ok=True)
    subprocess.run(["mount", "--bind", disk, path], check=True)


def worker_on_own_node(rank: int, world_size: int, run_dir: str, local_dir: str, disks: str) -> int:
    """llmtrain.worker as the only rank of node `rank`, whose checkpoint.local_dir is its own disk."""
    os.environ.update(GROUP_RANK=str(rank), LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
    own_disk(os.path.join(disks, f"node{rank}"), local_dir)
    from llmtrain import worker

    return worker.main([run_dir])
