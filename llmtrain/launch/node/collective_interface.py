"""Which network interface, and which IPv4 address, this node's collectives use (run on the node itself).

With GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME set, the interface they name: gloo takes names (node/env.py has already
turned NCCL's syntax into one), NCCL also takes prefixes (`eth` is any eth*), `=name` (exactly) and `^a,b` (any but
those). Unset, the interface of the route to the master address: the way this node reaches node 0.
"""

from __future__ import annotations

import socket

from llmtrain.launch.node.env import resolve


def interface_addresses() -> dict[str, list[str]]:
    """Interfaces that are up with an IPv4 address, in the kernel's order, each with its IPv4 addresses."""
    import psutil

    stats = psutil.net_if_stats()
    found = {}
    for name, addrs in psutil.net_if_addrs().items():
        ipv4 = [a.address for a in addrs if a.family == socket.AF_INET]
        if ipv4 and stats.get(name) and stats[name].isup:
            found[name] = ipv4
    return found


def named_interface(var: str, value: str, interfaces: list[str]) -> str | None:
    """The interface `value` of `var` selects among `interfaces`; a gloo name is taken as it is."""
    if value.startswith(("^", "=")):
        return resolve(value, interfaces)
    names = [n.strip() for n in value.split(",") if n.strip()]
    if var.startswith("NCCL_"):
        return next((i for i in interfaces if i.startswith(tuple(names))), None)
    return names[0] if names else None


def source_address(host: str) -> str | None:
    """The local IPv4 address the kernel would send from to reach `host` (no packet is sent)."""
    try:
        ip = socket.getaddrinfo(host, None, socket.AF_INET)[0][4][0]
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((ip, 9))
            return s.getsockname()[0]
    except (OSError, IndexError):
        return None


def collective_interface(var: str, value: str | None, master_addr: str) -> dict:
    """{"variable", "interface", "address", "via"} for the backend whose interface variable is `var`."""
    addresses = interface_addresses()
    if value:
        name, via = named_interface(var, value, list(addresses)), f"{var}={value}"
        return {"variable": var, "interface": name, "address": addresses.get(name, [None])[0], "via": via}
    address = source_address(master_addr)
    name = next((n for n, owned in addresses.items() if address in owned), None)
    return {"variable": var, "interface": name, "address": address, "via": f"route to {master_addr}"}
