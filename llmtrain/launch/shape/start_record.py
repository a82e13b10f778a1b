"""A start's shape in RUN_DIR/job.json, written by whoever starts the nodes (a Slurm job's batch script, the ssh
launcher) before any worker runs, and read by every worker, which trains the recorded layout. The workers do not
re-plan themselves: a re-plan that falls back to plan --suggest's search ranks layouts by a speed measured on the
spot, and every rank must train the same one."""

from __future__ import annotations

import time

from llmtrain.config.errors import ConfigError
from llmtrain.launch.shape.replan import StartShape, degrees, with_overrides

SHAPE = "shape"  # the launch entry's key: the newest start's shape
STARTS = "starts"  # the launch entry's key: every start's node count, hosts and layout, oldest first


def start_entry(cfg, shape: StartShape, hosts: list[str] | None) -> dict:
    """What job.json keeps of one start (status and report show it)."""
    return {"time": time.strftime("%Y-%m-%d %H:%M:%S"), "nnodes": shape.nnodes, "of": cfg.cluster.nnodes,
            "hosts": hosts, "layout": degrees(with_overrides(cfg, shape.overrides)), "how": shape.how}


def record_facts(cfg, shape: StartShape, hosts: list[str] | None, entry: dict) -> dict:
    """The launch entry's new facts for this start: its shape, and one more item of its starts."""
    return {SHAPE: shape.to_record(), STARTS: [*entry.get(STARTS, []), start_entry(cfg, shape, hosts)]}


def config_for_start(cfg, entry: dict, world_size: int):
    """The config this worker trains: RUN_DIR/config.yaml as it is when the ranks are the ones it asks for, else
    with the recorded shape of this start applied. ConfigError when no recorded shape has this many ranks."""
    per_node = cfg.cluster.nproc_per_node
    if world_size == cfg.cluster.nnodes * per_node:
        return cfg
    shape = entry.get(SHAPE) or {}
    if shape.get("nnodes", 0) * per_node == world_size:
        return with_overrides(cfg, shape.get("overrides") or {})
    raise ConfigError("cluster.nnodes", f"{world_size} ranks started, but the config asks for "
                                        f"{cfg.cluster.nnodes} x {per_node} and no start of this launch recorded "
                                        "a layout for that many")
