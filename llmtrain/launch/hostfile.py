"""DeepSpeed-style hostfiles: one `hostname slots=N` per line, `#` comments, blank lines ignored.

Hostnames are checked against a strict pattern before anything uses them: a line holding shell metacharacters
is an error naming the file and line, so it can never reach a remote shell.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from llmtrain.config.errors import ConfigError

_HOST = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$")
_SLOTS = re.compile(r"^slots=(\d+)$")


@dataclass(frozen=True)
class Host:
    name: str
    slots: int


def parse_hostfile(path: str) -> list[Host]:
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        raise ConfigError("cluster.hostfile", f"no such file: {path}") from None
    except OSError as e:
        raise ConfigError("cluster.hostfile", f"cannot read {path}: {e.strerror}") from None
    hosts, seen = [], {}  # lower-case name -> (line number, name as written): host names are case-insensitive
    for number, raw in enumerate(lines, 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        where = f"{path}:{number}"
        if not _HOST.match(parts[0]):
            raise ConfigError("cluster.hostfile", f"{where}: invalid hostname {parts[0]!r} (letters, digits, "
                                                  "'.', '-', '_' only)")
        if len(parts) > 2 or (len(parts) == 2 and not _SLOTS.match(parts[1])):
            raise ConfigError("cluster.hostfile", f"{where}: expected 'hostname slots=N', got {raw.strip()!r}")
        slots = int(_SLOTS.match(parts[1]).group(1)) if len(parts) == 2 else 1
        if slots == 0:
            raise ConfigError("cluster.hostfile", f"{where}: {parts[0]} slots=0: a host runs at least one process "
                                                  "(delete the line, or use cluster.exclude, to leave it out)")
        first = seen.get(parts[0].lower())
        if first:
            same = "" if first[1] == parts[0] else " (host names are case-insensitive)"
            raise ConfigError("cluster.hostfile", f"{where}: host {parts[0]} is listed twice: line {first[0]} has "
                                                  f"{first[1]}{same}; keep one line")
        seen[parts[0].lower()] = (number, parts[0])
        hosts.append(Host(parts[0], slots))
    if not hosts:
        raise ConfigError("cluster.hostfile", f"{path} lists no hosts")
    return hosts


def _host_list(value: str | None, key: str) -> list[str]:
    if not value:
        return []
    names = [n.strip() for n in re.split(r"[,@]", value) if n.strip()]
    for n in names:
        if not _HOST.match(n):
            raise ConfigError(key, f"invalid hostname {n!r}")
    return names


def select_hosts(hosts: list[Host], include: str | None, exclude: str | None) -> list[Host]:
    """Apply cluster.include / cluster.exclude (host names separated by ',' or '@', as DeepSpeed's --include)."""
    known = {h.name.lower() for h in hosts}  # host names are case-insensitive
    inc, exc = _host_list(include, "cluster.include"), _host_list(exclude, "cluster.exclude")
    for key, names in (("cluster.include", inc), ("cluster.exclude", exc)):
        unknown = [n for n in names if n.lower() not in known]
        if unknown:
            raise ConfigError(key, f"not in the hostfile: {', '.join(unknown)}")
    inc, exc = {n.lower() for n in inc}, {n.lower() for n in exc}
    chosen = [h for h in hosts if (not inc or h.name.lower() in inc) and h.name.lower() not in exc]
    if not chosen:
        raise ConfigError("cluster.include", "no host left after cluster.include / cluster.exclude")
    return chosen


def _job_hosts(cluster_cfg) -> list[Host]:
    """The first cluster.nnodes hosts of the hostfile after cluster.include / cluster.exclude."""
    if not cluster_cfg.hostfile:
        raise ConfigError("cluster.hostfile", "cluster=ssh needs a hostfile (lines of 'hostname slots=N')")
    hosts = select_hosts(parse_hostfile(cluster_cfg.hostfile), cluster_cfg.include, cluster_cfg.exclude)
    n = cluster_cfg.nnodes
    if len(hosts) < n:
        raise ConfigError("cluster.nnodes", f"nnodes={n} but the hostfile (after include/exclude) has "
                                            f"{len(hosts)} host(s): {', '.join(h.name for h in hosts)}")
    return hosts[:n]


def slots_per_node(cluster_cfg) -> int:
    """cluster.nproc_per_node=null: the slots of the hosts the job runs on (DeepSpeed's meaning), which must agree
    since torchrun starts the same number of processes on every node."""
    hosts = _job_hosts(cluster_cfg)
    if len({h.slots for h in hosts}) > 1:
        slots = ", ".join(f"{h.name} slots={h.slots}" for h in hosts)
        raise ConfigError("cluster.nproc_per_node", f"null takes the processes per node from the slots of "
                                                    f"{cluster_cfg.hostfile}, but they differ ({slots}): set "
                                                    "cluster.nproc_per_node")
    return hosts[0].slots


def cluster_hosts(cluster_cfg) -> list[Host]:
    """The hosts a cluster=ssh config runs on, each with a slot for every process it gets."""
    hosts = _job_hosts(cluster_cfg)
    short = [h.name for h in hosts if h.slots < cluster_cfg.nproc_per_node]
    if short:
        raise ConfigError("cluster.nproc_per_node", f"nproc_per_node={cluster_cfg.nproc_per_node} exceeds the "
                                                    f"slots of {', '.join(short)} in {cluster_cfg.hostfile}")
    return hosts
