"""Runs on each node in front of the node agent: `python -m llmtrain.launch.node.env -- CMD...`.

The network presets give GLOO_SOCKET_IFNAME in NCCL's syntax (`^lo,docker`: any interface but those), which gloo
does not understand (it takes interface names only, and fails on `^lo`). This turns such a value into the name of
this node's first interface that is up, has an IPv4 address and is not excluded, then execs CMD. A plain name is
left as it is. One interface, not several: gloo opens one device per name and every rank must have as many.
"""

from __future__ import annotations

import os
import socket
import sys

VAR = "GLOO_SOCKET_IFNAME"


def needs_resolving(value: str | None) -> bool:
    return bool(value) and value.startswith(("^", "="))


def resolve(value: str, interfaces: list[str]) -> str | None:
    """NCCL's syntax (`^a,b` excludes names starting with a or b; `=a` is exactly a) against this node's usable
    interfaces, in the kernel's order; None when none fits."""
    if value.startswith("="):
        name = value[1:].split(",")[0]
        return name if name in interfaces else None
    excluded = tuple(p for p in value[1:].split(",") if p)
    return next((name for name in interfaces if not name.startswith(excluded)), None)


def wrap_for_gloo(argv: list[str], env: dict[str, str], python: str) -> list[str]:
    """argv behind this module when the environment it gets holds a GLOO_SOCKET_IFNAME to resolve on the node."""
    return [python, "-m", "llmtrain.launch.node.env", "--", *argv] if needs_resolving(env.get(VAR)) else argv


def usable_interfaces() -> list[str]:
    import psutil

    stats = psutil.net_if_stats()
    return [name for name, addrs in psutil.net_if_addrs().items()
            if stats.get(name) and stats[name].isup and any(a.family == socket.AF_INET for a in addrs)]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] != ["--"] or len(argv) < 2:
        print("usage: python -m llmtrain.launch.node.env -- CMD...", file=sys.stderr)
        return 2
    value = os.environ.get(VAR)
    if needs_resolving(value):
        interfaces = usable_interfaces()
        name = resolve(value, interfaces)
        if name is None:
            print(f"llmtrain: {VAR}={value} matches no interface of {socket.gethostname()} that is up with an IPv4 "
                  f"address ({', '.join(interfaces) or 'none'}); set +env.{VAR}=NAME", file=sys.stderr)
            return 1
        os.environ[VAR] = name
    os.execvp(argv[1], argv[1:])
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
