"""`llmtrain plan --suggest [N_GPUS GIB]`: the layouts that fit, fastest first (search.py), and why the first wins.

Without numbers it plans the config's devices (cluster.nnodes x cluster.nproc_per_node) against the hardware
profile's memory; with N_GPUS and GIB it plans N_GPUS devices (up to 8 to a node) of GIB GiB each."""

from __future__ import annotations

import json

from rich.console import Console

from llmtrain.config import ConfigError
from llmtrain.console import fold_table, plain
from llmtrain.errors import EXIT_FAILED, EXIT_OK
from llmtrain.plan.estimate import Plan
from llmtrain.plan.search import Search

SHOWN = 15  # table rows
JSON_SHOWN = 20


def devices(cfg, hw: dict, numbers: list[float]) -> tuple[int, int, float]:
    """(devices, devices per node, GiB each) from --suggest's numbers (none, or N_GPUS and GIB)."""
    if len(numbers) == 2:
        n, gib = numbers
        if n < 1 or n != int(n) or gib <= 0:
            raise ConfigError("--suggest", f"needs a whole number of devices >= 1 and GiB > 0 (got {n:g} {gib:g})")
        return int(n), min(8, int(n)), gib
    if numbers:
        raise ConfigError("--suggest", f"takes no numbers (the config's devices and the hardware profile's memory) "
                                       f"or two, N_GPUS GIB (got {len(numbers)})")
    if not hw.get("memory_gib"):
        raise ConfigError("--suggest", f"hardware={hw['name']} has no memory size; give it: --suggest N_GPUS GIB")
    per_node = cfg.cluster.nproc_per_node
    return cfg.cluster.nnodes * per_node, per_node, float(hw["memory_gib"])


def layout_cells(p: Plan) -> dict:
    d = p.dims
    return {"tp": d["tp"], "pp": d["pp"], "cp": d["cp"], "dp": d["dp"], "ep": d["ep"], "zero": d["zero"],
            "recompute": d["recompute"], "micro": d["micro_batch_size"]}


def differences(first: Plan, other: Plan) -> str:
    """The keys in which `other` differs from `first`, as 'tp=2 cp=1' (other's values)."""
    a, b = layout_cells(first), layout_cells(other)
    return " ".join(f"{k}={b[k]}" for k in a if a[k] != b[k] and k != "dp")


def why_line(plans: list[Plan], fitting: int, planned: int) -> str:
    """Why the first-ranked layout wins, and what the runner-up lacks."""
    first = plans[0]
    head = f"why first: the fastest est. tokens/s of {fitting:,} layouts that fit ({planned:,} planned)"
    if len(plans) == 1:
        return head
    second = plans[1]
    lag = 1 - second.tokens_per_s / first.tokens_per_s
    what = differences(first, second)
    if lag < 0.0005:
        gib = second.peak_bytes_per_rank / 2**30, first.peak_bytes_per_rank / 2**30
        return (f"{head}; the runner-up ({what}) is as fast (within 0.05%), at {gib[0]:,.2f} GiB per rank "
                f"against {gib[1]:,.2f}")
    extra_comm = second.exposed_comm_s - first.exposed_comm_s
    extra_compute = second.compute_s - first.compute_s
    if extra_comm >= extra_compute:
        cost = f"{extra_comm:,.3f} s more exposed communication a step"
    else:
        cost = f"{extra_compute:,.3f} s more compute a step (recompute, pipeline bubble)"
    return f"{head}; the runner-up ({what}) is {lag:.1%} slower: {cost}"


def suggest(cfg, numbers: list[float], speed_tflops: float, hw: dict, console: Console, as_json: bool,
            parameters_line: str, estimate_basis: str, no_mfu_line) -> int:
    n, per_node, gib = devices(cfg, hw, numbers)
    search = Search(cfg, n, per_node, speed_tflops * 1e12, gib * 2**30, hw)
    plans, fitting = search.suggested(JSON_SHOWN if as_json else SHOWN)
    if as_json:
        print(json.dumps([p.to_dict() for p in plans], indent=1, default=str))
        return EXIT_OK if plans else EXIT_FAILED
    table = fold_table(f"layouts that fit {n} devices of {gib:g} GiB (global batch {cfg.train.global_batch_size}), "
                       "fastest first")
    with_mfu = bool(plans) and plans[0].mfu is not None
    with_ep = cfg.model.moe is not None
    for col in ("tp", "pp", "cp", "dp", *(("ep",) if with_ep else ()), "zero", "recompute", "micro", "peak GiB",
                "est. tokens/s", *(("est. MFU",) if with_mfu else ())):
        table.add_column(col, justify="right")
    for p in plans:
        c = layout_cells(p)
        table.add_row(*(str(c[k]) for k in ("tp", "pp", "cp", "dp")), *((str(c["ep"]),) if with_ep else ()),
                      str(c["zero"]), c["recompute"], str(c["micro"]), f"{p.peak_bytes_per_rank / 2**30:,.2f}",
                      f"{p.tokens_per_s:,.0f}", *((f"~{p.mfu:.0%}",) if with_mfu else ()))
    console.print(table if plans else f"no layout of {n} devices fits in {gib:g} GiB per device; try more devices, "
                                      "a smaller train.global_batch_size or a shorter model.seq_len")
    plain(parameters_line, console=console)
    if plans:
        plain(why_line(plans, fitting, search.planned), console=console)
        plain(f"estimates: {estimate_basis}", console=console)
        if not with_mfu:
            plain(no_mfu_line(plans[0]), console=console)
    return EXIT_OK if plans else EXIT_FAILED
