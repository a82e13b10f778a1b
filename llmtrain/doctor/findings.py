"""What `llmtrain doctor` makes of the ranks' report: the problems it finds, and the tables and lines it prints
(versions per rank, interface and address per node, all-reduce and all-to-all bandwidth intra-node / inter-node /
all)."""

from __future__ import annotations

from typing import NamedTuple

from omegaconf import DictConfig
from rich.console import Console

from llmtrain.config.derived import world_size
from llmtrain.console import fold_table, plain


class Collective(NamedTuple):
    """Where a collective's sweep lies in the report, and how it is headed."""

    sizes: str
    sweeps: str
    heading: str
    table_title: str
    show_algbw: bool


COLLECTIVES = {
    "all_reduce": Collective("sizes", "sweeps", "all_reduce bus bandwidth, best over the sweep (sum, fp32; busbw = "
                             "algbw x 2(n-1)/n):", "all_reduce bus bandwidth (GB/s) per message size", False),
    # algbw too: the rate at which a rank's tokens reach their experts, what expert parallel waits on.
    "all_to_all": Collective("all_to_all_sizes", "all_to_all_sweeps", "all_to_all bandwidth, best over the sweep "
                             "(equal splits, fp32; busbw = algbw x (n-1)/n):",
                             "all_to_all bandwidth (GB/s) per message size, busbw / algbw", True),
}


def per_node(report: dict) -> list[dict]:
    """The first rank of each node, in node order: what it says holds for its node."""
    first: dict[int, dict] = {}
    for r in report["ranks"]:
        first.setdefault(r["node"], r)
    return [first[n] for n in sorted(first)]


def problems(report: dict, cfg: DictConfig) -> list[str]:
    out = []
    ranks = report["ranks"]
    expected = world_size(cfg)
    if len(ranks) != expected:
        out.append(f"{len(ranks)} ranks answered, {expected} expected")
    for key in ("python", "torch", "cuda", "nccl"):
        values = {r[key] for r in ranks}
        if len(values) > 1:
            where = ", ".join(f"{r['host']}={r[key]}" for r in ranks)
            out.append(f"{key} versions differ across ranks: {where}")
    want_cuda = cfg.device == "cuda" or (cfg.device == "auto" and any(r["cuda_available"] for r in ranks))
    missing = sorted({r["host"] for r in ranks if want_cuda and not r["cuda_available"]})
    if missing:
        out.append(f"no CUDA device visible on {', '.join(missing)}")
    nodes = per_node(report)
    nccl_keys = {k for r in nodes for k in r["env"] if k.startswith("NCCL_")}
    for key in sorted(nccl_keys):
        values = {r["env"].get(key) for r in nodes}
        if len(values) > 1:
            out.append(f"{key} differs across nodes: {values}")
    for r in nodes:
        out += interface_problems(r, len(nodes))
    return out


def interface_problems(r: dict, nnodes: int) -> list[str]:
    out = []
    for i in r["interfaces"]:
        where = f"node {r['node']} ({r['host']}), {i['backend']}"
        if i["interface"] is None or i["address"] is None:
            out.append(f"{where}: {i['via']} gives no interface that is up with an IPv4 address")
        elif nnodes > 1 and i["address"].startswith("127."):
            out.append(f"{where}: {i['via']} is {i['interface']} ({i['address']}), a loopback address the other "
                       f"nodes cannot reach; set +env.{i['variable']}=NAME")
    return out


def human_bytes(n: int) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:g} {unit}"
    return f"{n} B"


def render(report: dict, console: Console) -> None:
    ranks = fold_table("ranks")
    for col in ("rank", "node", "host", "python", "torch", "cuda", "nccl", "device", "gpu"):
        ranks.add_column(col)
    for i, r in enumerate(report["ranks"]):
        ranks.add_row(str(i), str(r["node"]), r["host"], r["python"], r["torch"], str(r["cuda"]), str(r["nccl"]),
                      r["device"], str(r["gpu"] or "-"))
    console.print(ranks)
    console.print(network_table(report))
    for r in per_node(report):
        env = " ".join(f"{k}={v}" for k, v in r["env"].items()) or "(none set)"
        plain(f"network environment on {r['host']}: {env}", console=console)
    for name, collective in COLLECTIVES.items():
        if collective.sweeps not in report:  # a report written before this collective was measured
            continue
        if measured(report, name):  # a single rank has nothing to time
            console.print(bandwidth_table(report, name))
        plain(collective.heading, console=console)
        for line in bandwidth_lines(report, name):
            plain(f"  {line}", console=console)


def network_table(report: dict):
    table = fold_table("network: the interface and address each node's collectives use")
    for col in ("node", "host", "backend", "interface", "address", "chosen by"):
        table.add_column(col)
    for r in per_node(report):
        for i in r["interfaces"]:
            table.add_row(str(r["node"]), r["host"], i["backend"], i["interface"] or "?", i["address"] or "?",
                          i["via"])
    return table


def measured(report: dict, collective: str = "all_reduce") -> list[dict]:
    return [s for s in report.get(COLLECTIVES[collective].sweeps, []) if s.get("results")]


def slowest(sweep: dict, index: int) -> dict:
    """The row of size `index` of the group that did worst at it (intra-node: the slowest node)."""
    return min((res["rows"][index] for res in sweep["results"]), key=lambda row: row["busbw_gbs"])


def bandwidth_table(report: dict, collective: str = "all_reduce"):
    spec = COLLECTIVES[collective]
    sweeps = measured(report, collective)
    table = fold_table(f"{spec.table_title}; intra-node: the slowest node")
    table.add_column("bytes", justify="right")
    for sweep in sweeps:
        table.add_column(sweep["scope"], justify="right")
    for index, size in enumerate(report[spec.sizes]):
        rows = [slowest(s, index) for s in sweeps]
        cells = [f"{r['busbw_gbs']:.3f}" + (f" / {r['algbw_gbs']:.3f}" if spec.show_algbw else "") for r in rows]
        table.add_row(f"{size:,}", *cells)
    return table


def describe(sweep: dict) -> str:
    groups = [res["ranks"] for res in sweep["results"]]
    if sweep["scope"] == "intra-node":
        return f"{len(groups[0])} ranks on " + (f"each of {len(groups)} nodes" if len(groups) > 1 else "one node")
    if sweep["scope"] == "inter-node":
        return f"1 rank on each of {len(groups[0])} nodes"
    return f"{len(groups[0])} ranks"


def bandwidth_lines(report: dict, collective: str = "all_reduce") -> list[str]:
    """One line per scope: its best bus bandwidth and the message size it came at (all-to-all: and its algorithm
    bandwidth), or why it was not measured."""
    spec = COLLECTIVES[collective]
    hosts = {r["node"]: r["host"] for r in per_node(report)}
    lines = []
    for sweep in report[spec.sweeps]:
        scope = sweep["scope"]
        if "skipped" in sweep:
            lines.append(f"{scope}: not measured ({sweep['skipped']})")
            continue
        if "same_as" in sweep:
            lines.append(f"{scope}: the same ranks as {sweep['same_as']}")
            continue
        # Each group's best size; of the groups (nodes), the one whose best is lowest.
        bests = [(max(enumerate(res["rows"]), key=lambda i_row: i_row[1]["busbw_gbs"]), res["node"])
                 for res in sweep["results"]]
        (index, row), node = min(bests, key=lambda b: b[0][1]["busbw_gbs"])
        where = f"; slowest node {hosts.get(node, node)}" if len(bests) > 1 else ""
        algbw = f", algbw {row['algbw_gbs']:.3f} GB/s" if spec.show_algbw else ""
        # The size asked for: an all-to-all over n ranks sends a multiple of n elements, a little less.
        lines.append(f"{scope}: {row['busbw_gbs']:.3f} GB/s at {human_bytes(report[spec.sizes][index])}{algbw} "
                     f"({describe(sweep)}{where})")
    return lines
