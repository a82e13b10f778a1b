"""Where each rank runs, named one way by every backend: `rank 3 (node 1, host node2, local rank 1)`.

The node index is the launcher's: the hostfile's order for ssh, SLURM_NODEID for Slurm, cluster.node_rank locally.
The node agent hands it to torchrun's workers (NODE_INDEX_ENV); each worker records its place in
RUN_DIR/logs/rank{R}.place when it starts, so a rank that is later killed without a word can still be placed.
torchrun's own group rank is not used: its c10d rendezvous numbers nodes in the order they join.
"""

from __future__ import annotations

import os
import socket

from llmtrain.rundir import rank_files

NODE_INDEX_ENV = "LLMTRAIN_NODE_INDEX"


def rank_label(rank: int | None, node: int | None = None, host: str | None = None,
               local_rank: int | None = None) -> str:
    """`rank 3 (node 1, host node2, local rank 1)`, leaving out what is unknown."""
    parts = [f"node {node}" if node is not None else None, f"host {host}" if host else None,
             f"local rank {local_rank}" if local_rank is not None else None]
    where = ", ".join(p for p in parts if p)
    who = f"rank {rank}" if rank is not None else "a rank"
    return f"{who} ({where})" if where else who


def node_label(node: int, host: str | None = None) -> str:
    """`node 1 (host node2)`."""
    return f"node {node} (host {host})" if host else f"node {node}"


def record_place(run_dir: str, rank: int) -> dict:
    """Called by each worker as it starts (before anything can fail): its node, host, local rank, restart and
    process id (on its host)."""
    place = {"rank": rank, "node": _int(os.environ.get(NODE_INDEX_ENV)), "host": socket.gethostname(),
             "local_rank": _int(os.environ.get("LOCAL_RANK")),
             "restart": _int(os.environ.get("TORCHELASTIC_RESTART_COUNT")) or 0, "pid": os.getpid()}
    rank_files.write_place(run_dir, rank, place)
    return place


def read_places(run_dir: str) -> dict[int, dict]:
    """rank -> its recorded place, for every rank that recorded one."""
    return rank_files.read_places(run_dir)


def describe_rank(run_dir: str, rank: int, host: str | None = None, local_rank: int | None = None,
                  node: int | None = None) -> str:
    """rank_label with what the rank recorded, completed by what the caller knows (torchrun's summary gives the
    host and local rank; the ssh launcher knows the node)."""
    place = read_places(run_dir).get(rank, {})

    def known(key: str, fallback):
        return fallback if place.get(key) is None else place[key]

    return rank_label(rank, known("node", node), known("host", host), known("local_rank", local_rank))


def _int(value: str | None) -> int | None:
    return int(value) if value is not None and value.lstrip("-").isdigit() else None
