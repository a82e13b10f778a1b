"""Before launch: a run that accepts fewer nodes (cluster.min_nnodes < cluster.nnodes) must have a backend that can
start on fewer nodes, and a layout for every node count it accepts. Both are known on the launcher's node, so a
run that could not go on after losing a node is refused now, not at 3 a.m. when it does."""

from __future__ import annotations

from llmtrain.config.errors import ConfigError
from llmtrain.launch.backends.traits import FIXED, traits_of
from llmtrain.launch.shape.replan import KEY, StartShape, replan


def min_nnodes(cfg) -> int:
    """The fewest nodes the run accepts: cluster.min_nnodes, null = cluster.nnodes."""
    c = cfg.cluster
    return c.nnodes if c.min_nnodes is None else c.min_nnodes


def elastic(cfg) -> bool:
    """Whether a start may have fewer nodes than cluster.nnodes."""
    return min_nnodes(cfg) < cfg.cluster.nnodes


def check_shapes(cfg) -> dict[int, StartShape]:
    """The shape of a start on each node count from cluster.min_nnodes to cluster.nnodes - 1; ConfigError naming
    cluster.min_nnodes for a backend that cannot start on fewer nodes, or a node count with no layout."""
    if not elastic(cfg):
        return {}
    if traits_of(cfg.cluster.name).resize == FIXED:
        raise ConfigError(KEY, f"cluster={cfg.cluster.name} starts exactly the nodes it is given; a run that goes on "
                               "with fewer nodes needs cluster=slurm or cluster=ssh (or leave cluster.min_nnodes "
                               "null)")
    return {n: replan(cfg, n) for n in range(min_nnodes(cfg), cfg.cluster.nnodes)}
