"""`llmtrain doctor`'s first step: can every node be used at all? Checked before any job starts, so a dead host
is named in seconds instead of surfacing as a rendezvous that never completes.

A backend that probes its hosts (ssh): every host of the hostfile (after cluster.include / cluster.exclude) answers
over ssh. One whose scheduler lists its nodes' states (Slurm): the partition has at least cluster.nnodes nodes that
are not down, drained or not responding. Otherwise (local) nothing to check: this node is the one running.
"""

from __future__ import annotations

from omegaconf import DictConfig
from rich.console import Console

from llmtrain.console import plain
from llmtrain.launch.hostfile import parse_hostfile, select_hosts
from llmtrain.launch.backends.reachability import check_hosts
from llmtrain.launch.backends.traits import traits_of
from llmtrain.slurm.node_states import parse_sinfo, run_sinfo


def nodes_ready(cfg: DictConfig, console: Console) -> bool:
    traits = traits_of(cfg.cluster.name)
    if traits.probes_hosts:
        return ssh_hosts_ready(cfg, console)
    if traits.lists_node_states:
        return slurm_nodes_ready(cfg, console)
    return True


def ssh_hosts_ready(cfg: DictConfig, console: Console) -> bool:
    c = cfg.cluster
    hosts = [h.name for h in select_hosts(parse_hostfile(c.hostfile), c.include, c.exclude)]
    checks = check_hosts(c, hosts, cfg.doctor.connect_timeout_s)
    down = [check for check in checks if check.error]
    if not down:
        slowest = max(check.seconds for check in checks)
        plain(f"llmtrain doctor: {len(hosts)} host(s) answered over ssh ({', '.join(hosts)}; slowest "
              f"{slowest:.1f} s)", console=console)
        return True
    for check in down:
        plain(check.line(), console=console)
    plain(f"llmtrain doctor: {unreachable_advice(c, hosts, [check.host for check in down])}", console=console)
    return False


def unreachable_advice(cluster: DictConfig, hosts: list[str], down: list[str]) -> str:
    """What to do about the hosts that did not answer: leave them out while others remain, else look for the
    common cause (excluding every host would leave nothing to run on)."""
    if len(down) == len(hosts):
        return (f"none of the {len(hosts)} host(s) of {cluster.hostfile} can be reached over ssh; nothing was "
                "started: check the host names in the hostfile, that they resolve from here (getent hosts NAME), "
                "and the ssh settings (cluster.ssh_user, cluster.ssh_port, cluster.ssh_identity, "
                "cluster.ssh_config, ~/.ssh/config)")
    names = ",".join(([cluster.exclude] if cluster.exclude else []) + down)  # added to the user's own
    left = len(hosts) - len(down)
    fewer = f", with cluster.nnodes={left}: {left} host(s) left" if left < cluster.nnodes else ""
    return (f"{len(down)} of {len(hosts)} host(s) of {cluster.hostfile} cannot be reached over ssh; nothing was "
            f"started (cluster.exclude={names} leaves them out{fewer})")


def slurm_nodes_ready(cfg: DictConfig, console: Console) -> bool:
    c = cfg.cluster
    text, error = run_sinfo(c.partition)
    if text is None:
        plain(f"llmtrain doctor: {error}; node states not checked", console=console)
        return True
    partition, nodes = parse_sinfo(text, c.partition)
    where = f"partition {partition}" if partition else "the cluster"
    for node in nodes:
        if not node.usable:
            plain(node.line(), console=console)
    usable = [node.name for node in nodes if node.usable]
    counted = f"{where}: {len(usable)} of {len(nodes)} node(s) usable"
    if len(usable) < c.nnodes:
        plain(f"llmtrain doctor: {counted}, fewer than cluster.nnodes={c.nnodes}: the job could not "
              "start; nothing was submitted", console=console)
        return False
    plain(f"llmtrain doctor: {counted} ({', '.join(usable)}); cluster.nnodes={c.nnodes}", console=console)
    return True
