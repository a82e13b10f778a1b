"""The options every ssh the launcher starts gets: the cluster's ssh keys, BatchMode and keepalives. The ssh backend
and the reachability check both build their command lines here, so a host that passes the check is reached the same
way by the launch."""

from __future__ import annotations

# ssh gives up on a host that answered none of 3 keepalives 5 s apart: a partitioned node is named in ~15 s.
SSH_KEEPALIVE = ("-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3")


def ssh_base(cluster) -> list[str]:
    argv = ["ssh", "-o", "BatchMode=yes", *SSH_KEEPALIVE]
    if cluster.ssh_config:
        argv += ["-F", cluster.ssh_config]
    if cluster.ssh_port:
        argv += ["-p", str(cluster.ssh_port)]
    if cluster.ssh_identity:
        argv += ["-i", cluster.ssh_identity]
    if cluster.ssh_user:
        argv += ["-l", cluster.ssh_user]
    return argv
