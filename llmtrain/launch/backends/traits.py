"""What each backend is, as facts the rest of llmtrain reads instead of comparing backend names.

Jobs, sweeps, tuning, doctor, preflight, containers, the node agent and config checks ask "does this backend own
its processes?", "is a job queued?", "how does it shrink?", never "is it Slurm?". A new backend (Kubernetes next)
adds its module and one BackendTraits entry here; nothing outside launch/backends/ changes. No imports beyond the
standard library: config validation reads these before any backend module is loaded.
"""

from __future__ import annotations

from dataclasses import dataclass

# How a backend runs on fewer nodes than cluster.nnodes (down to cluster.min_nnodes):
FIXED = "fixed"  # it cannot: every node it is given is started, or none
SCHEDULER = "scheduler"  # the scheduler grants between min and max nodes (Slurm's --nodes=MIN-MAX)
REACHABLE_HOSTS = "reachable_hosts"  # the launcher starts on the hosts that answer (ssh)


@dataclass(frozen=True)
class BackendTraits:
    name: str
    # The job's processes are this launcher's to stop and to watch (local, ssh), not a scheduler's.
    owns_processes: bool
    # A submitted job waits in a queue and outlives the launcher; it has a job id (Slurm).
    queued: bool
    # The launcher runs on the job's only node, so it can read that node's memory and devices before the start.
    launcher_is_the_node: bool
    # Nodes the launcher reaches one by one before the job (ssh), so doctor can probe each of them.
    probes_hosts: bool
    # Container runtimes that can wrap each node's command (cluster.container.runtime).
    container_runtimes: tuple[str, ...]
    # The environment variable that gives a node agent its node rank; None: the launcher passes it.
    node_rank_env: str | None
    # How it runs on fewer nodes than asked (FIXED, SCHEDULER, REACHABLE_HOSTS).
    resize: str
    # Its nodes are the hosts of cluster.hostfile (ssh): the file is required, and its slots can give nproc_per_node.
    uses_hostfile: bool = False
    # The scheduler lists its nodes and their states (Slurm's sinfo), so doctor can count the usable ones.
    lists_node_states: bool = False


TRAITS = {
    "local": BackendTraits("local", owns_processes=True, queued=False, launcher_is_the_node=True,
                           probes_hosts=False, container_runtimes=(), node_rank_env=None, resize=FIXED,
                           uses_hostfile=False, lists_node_states=False),
    "ssh": BackendTraits("ssh", owns_processes=True, queued=False, launcher_is_the_node=False, probes_hosts=True,
                         container_runtimes=("apptainer",), node_rank_env=None, resize=REACHABLE_HOSTS,
                         uses_hostfile=True, lists_node_states=False),
    "slurm": BackendTraits("slurm", owns_processes=False, queued=True, launcher_is_the_node=False,
                           probes_hosts=False, container_runtimes=("pyxis", "apptainer"),
                           node_rank_env="SLURM_NODEID", resize=SCHEDULER,
                           uses_hostfile=False, lists_node_states=True),
}
BACKEND_NAMES = tuple(TRAITS)


def traits_of(name: str) -> BackendTraits:
    """The traits of backend `name` (cluster.name); KeyError for an unknown one, which config validation has
    refused before anything reads traits (a launch record's name: known_traits)."""
    return TRAITS[name]


def known_traits(name: str | None) -> BackendTraits | None:
    """The traits of a backend named where validation never looked (a launch record's "backend", the node agent's
    argument, a config still being composed); None for a name this llmtrain does not know, which readers treat as
    neither owned nor queued."""
    return TRAITS.get(name) if isinstance(name, str) else None
