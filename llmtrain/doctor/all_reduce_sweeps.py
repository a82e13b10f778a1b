"""`llmtrain doctor`'s all-reduce sweeps, timed the way nccl-tests' all_reduce_perf does, and beside each its
all-to-all sweep (all_to_all_sweeps), over three scopes:

- intra-node: each node's ranks among themselves (all nodes at once, each its own group);
- inter-node: one rank per node (local rank 0), so the figure is the network's alone;
- all: every rank, what data parallel training sees.

A scope whose groups are those of an earlier scope (one node: all = intra-node; one process per node: all =
inter-node) is not measured twice, and a group of one rank has nothing to measure.
"""

from __future__ import annotations

from llmtrain.doctor.all_to_all_sweeps import time_all_to_all
from llmtrain.doctor.collective_timing import row, slowest_seconds

SCOPES = ("intra-node", "inter-node", "all")


def plan_sweeps(placement: list[tuple[int, int]]) -> list[dict]:
    """placement[rank] = (node, local rank). One entry per scope: {"scope", "groups"} to measure, or {"scope",
    "same_as"} / {"scope", "skipped"} saying why not."""
    nodes = sorted({node for node, _ in placement})
    by_node = {n: [r for r, (node, _) in enumerate(placement) if node == n] for n in nodes}
    candidates = {
        "intra-node": [by_node[n] for n in nodes],
        "inter-node": [[min(by_node[n], key=lambda r: placement[r][1]) for n in nodes]],
        "all": [list(range(len(placement)))],
    }
    why_not = {"intra-node": "one process per node", "inter-node": "one node", "all": "one rank"}
    sweeps: list[dict] = []
    for scope in SCOPES:
        groups = [g for g in candidates[scope] if len(g) > 1]
        earlier = next((s["scope"] for s in sweeps if s.get("groups") == groups), None)
        if not groups:
            sweeps.append({"scope": scope, "skipped": why_not[scope]})
        elif earlier:
            sweeps.append({"scope": scope, "same_as": earlier})
        else:
            sweeps.append({"scope": scope, "groups": groups})
    return sweeps


def bus_bandwidth(algbw: float, n: int) -> float:
    """nccl-tests' all-reduce bus bandwidth: what each link carries, comparable across group sizes."""
    return algbw * 2 * (n - 1) / n if n > 1 else 0.0


def time_all_reduce(device, sizes: list[int], iters: int, group, n: int) -> list[dict]:
    """all_reduce (sum, fp32) over `group` of `n` ranks; the slowest rank's time per size."""
    import torch
    import torch.distributed as dist

    rows = []
    for size in sizes:
        x = torch.ones(max(1, size // 4), dtype=torch.float32, device=device)
        seconds = slowest_seconds(device, lambda: dist.all_reduce(x, group=group), iters, group)
        rows.append(row(x.numel() * 4, seconds, bus_bandwidth(1.0, n)))
    return rows


def run_sweeps(device, placement: list[tuple[int, int]], sizes: list[int], all_to_all_sizes: list[int],
               iters: int) -> dict:
    """Every rank calls this; rank 0 gets {"sweeps": all-reduce, "all_to_all_sweeps": all-to-all}, each a list of
    scopes whose measured groups' rows are under "results" ({"ranks", "node", "rows"}). Scopes run one after
    another, so inter-node traffic never overlaps an intra-node timing."""
    import torch.distributed as dist

    rank = dist.get_rank()
    sweeps = plan_sweeps(placement)
    # Every rank creates every group, in the same order (torch.distributed requires it, members or not).
    handles = {}
    for sweep in sweeps:
        for group in sweep.get("groups", []):
            handles[tuple(group)] = dist.new_group(group)
    mine: dict[str, dict[str, list[dict]]] = {"all_reduce": {}, "all_to_all": {}}
    for sweep in sweeps:
        for group in sweep.get("groups", []):
            if rank in group:
                handle, n = handles[tuple(group)], len(group)
                reduced = time_all_reduce(device, sizes, iters, handle, n)
                exchanged = time_all_to_all(device, all_to_all_sizes, iters, handle, n)
                if rank == group[0]:
                    mine["all_reduce"][sweep["scope"]] = reduced
                    mine["all_to_all"][sweep["scope"]] = exchanged
        dist.barrier()
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine)

    def with_results(collective: str) -> list[dict]:
        return [{**sweep, "results": [{"ranks": g, "node": placement[g[0]][0],
                                       "rows": gathered[g[0]][collective][sweep["scope"]]}
                                      for g in sweep.get("groups", [])]} for sweep in sweeps]

    return {"sweeps": with_results("all_reduce"), "all_to_all_sweeps": with_results("all_to_all")}
