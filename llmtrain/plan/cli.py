"""`llmtrain plan [OVERRIDES] [--json] [--suggest N_GPUS GIB]`: what the composed config costs, before launch."""

from __future__ import annotations

import argparse
import json

from rich.console import Console

from llmtrain.config import ConfigError, validate
from llmtrain.console import fold_table, get_console, plain
from llmtrain.errors import EXIT_FAILED, EXIT_OK
from llmtrain.hardware import profiles as hardware
from llmtrain.plan import calibration
from llmtrain.plan.estimate import build_plan


def add_plan_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the plan as JSON (for scripts)")
    parser.add_argument("--suggest", nargs=2, metavar=("N_GPUS", "GIB"), type=float, default=None,
                        help="rank the layouts (tp, pp, zero, recompute) that fit N_GPUS devices of GIB GiB")


def plan_for(cfg, memory_gib: float | None = None, calibrated: bool = True):
    """The plan of `cfg`; its step time with the factors `llmtrain tune` fitted for this hardware profile and model
    family when there are any (calibrated=False: the profile's assumptions)."""
    hw = hardware.resolve(cfg.hardware, cfg.precision.compute_dtype, hardware.load_profile)
    if hw["peak_tflops"] is None:  # a plan's step time needs a peak (training only goes without MFU)
        raise ConfigError("hardware", hardware.missing_peak(hw, cfg.precision.compute_dtype))
    found = calibration.lookup(hw["name"], calibration.family(cfg.model)) if calibrated else None
    if found is not None:
        hw = {**hw, "efficiency": found.efficiency, "comm_factor": found.comm_factor, "calibration": found.line()}
    memory = memory_gib if memory_gib is not None else hw["memory_gib"]
    return build_plan(cfg, hw["peak_tflops"] * 1e12, memory * 2**30 if memory else None, hw)


def _gib(x: float) -> str:
    return f"{x / 2**30:,.2f}"


def render(plan, console: Console) -> None:
    d = plan.dims
    summary = fold_table("plan", show_header=False)
    summary.add_column(style="bold")
    summary.add_column()
    rows = [
        ("parameters", f"{plan.params_total:,} ({plan.params_non_embedding:,} non-embedding)"),
        ("layout", f"dp={d['dp']} (shard {d['dp_shard']}) tp={d['tp']} pp={d['pp']} x v{d['virtual_stages']} "
                   f"zero={d['zero']} schedule={d['schedule']} recompute={d['recompute']}"
                   + (f"/every {d['recompute_every']}" if d['recompute_every'] > 1 else "")
                   + (" +sp" if d['sequence_parallel'] else "")),
        ("world size", str(plan.world_size)),
        ("micro-batches per step", str(plan.micro_batches)),
        ("FLOPs per token", f"{plan.flops_per_token:.3e}"),
        ("pipeline bubble", f"{plan.bubble_fraction:.1%} of the step"),
        ("peak memory per rank", f"{_gib(plan.peak_bytes_per_rank)} GiB (stage {plan.heaviest_stage}'s rank)"),
        ("device memory", f"{plan.hardware['memory_gib']:,.1f} GiB ({plan.hardware['name']})"
         if plan.hardware["memory_gib"] else "unknown"),
        ("fits", "[green]yes[/]" if plan.fits else "[red]NO[/]"),
        ("comm per step per rank", ", ".join(f"{k} {v / 1e9:,.3f} GB" for k, v in plan.comm_bytes_per_step.items())),
        ("est. step time", f"{plan.step_time_s:,.3f} s"),
        ("est. tokens/s", f"{plan.tokens_per_s:,.0f}"),
        ("est. MFU", f"{plan.mfu:.1%} of {plan.hardware['peak_tflops']:,.1f} TFLOPS/device"),
    ]
    for k, v in rows:
        summary.add_row(k, v)
    console.print(summary)
    stages = fold_table("per stage (GiB per rank)")
    for col in ("stage", "layers", "params", "params/rank", "weights", "grads", "optimizer", "gathered",
                "activations", "in flight", "rank peak"):
        stages.add_column(col, justify="right")
    for s in plan.stages:
        b = s.state_bytes
        layers = f"{s.layers[0]}-{s.layers[-1]}" if s.layers else "-"
        stages.add_row(str(s.stage), layers, f"{s.params:,}", f"{s.params_per_rank:,}", _gib(b["params"]),
                       _gib(b["grads"]), _gib(b["optimizer"]), _gib(b["gathered_params"]),
                       _gib(s.activation_bytes), f"{s.in_flight:g}", _gib(s.peak_bytes))
    console.print(stages)
    for note in plan.notes:
        console.print(f"note: {note}", highlight=False)


def candidates(cfg, n_gpus: int, per_node: int | None = None):
    """Layouts for n_gpus devices, per_node of them on each node (default: up to 8): tp within a node, pp dividing
    the layers, every zero and recompute."""
    per_node = per_node or min(8, n_gpus)
    if n_gpus % per_node:
        return
    for tp in (1, 2, 4, 8):
        if tp > per_node:
            continue
        for pp in range(1, cfg.model.n_layers + 1):
            if tp * pp > n_gpus or n_gpus % (tp * pp) or cfg.model.n_layers % pp:
                continue
            for zero in (0, 2, 3):
                for recompute in ("none", "selective", "full"):
                    c = cfg.copy()
                    c.cluster.nproc_per_node, c.cluster.nnodes = per_node, n_gpus // per_node
                    c.parallel.tp, c.parallel.pp, c.parallel.zero = tp, pp, zero
                    c.parallel.dp, c.parallel.dp_shard, c.parallel.virtual_stages = n_gpus // (tp * pp), None, 1
                    c.parallel.pp_schedule, c.parallel.pp_layers = "1f1b", None
                    c.parallel.sequence_parallel = tp > 1
                    c.recompute.mode, c.recompute.every = recompute, 1
                    try:
                        validate(c)
                    except ConfigError:
                        continue
                    yield c


def suggest(cfg, n_gpus: int, gib: float, console: Console, as_json: bool) -> int:
    fitting = []
    for c in candidates(cfg, n_gpus):
        plan = plan_for(c, memory_gib=gib)
        if plan.fits:
            fitting.append(plan)
    fitting.sort(key=lambda p: -p.tokens_per_s)
    if as_json:
        print(json.dumps([p.to_dict() for p in fitting[:20]], indent=1, default=str))
        return EXIT_OK if fitting else EXIT_FAILED
    table = fold_table(f"layouts that fit {n_gpus} devices of {gib:g} GiB (global batch "
                       f"{cfg.train.global_batch_size}, micro batch {cfg.train.micro_batch_size}), fastest first")
    for col in ("tp", "pp", "dp", "zero", "recompute", "peak GiB", "est. tokens/s", "est. MFU"):
        table.add_column(col, justify="right")
    for p in fitting[:15]:
        d = p.dims
        table.add_row(str(d["tp"]), str(d["pp"]), str(d["dp"]), str(d["zero"]), d["recompute"],
                      _gib(p.peak_bytes_per_rank), f"{p.tokens_per_s:,.0f}", f"{p.mfu:.1%}")
    console.print(table if fitting else f"no layout of {n_gpus} devices fits in {gib:g} GiB per device; try "
                                        "more devices, a smaller train.micro_batch_size or a shorter model.seq_len")
    if fitting and fitting[0].hardware.get("calibration"):
        plain(f"step times {fitting[0].hardware['calibration']}", console=console)
    return EXIT_OK if fitting else EXIT_FAILED


def run_plan(cfg, args) -> int:
    console = get_console()
    if args.suggest:
        n, gib = args.suggest
        return suggest(cfg, int(n), gib, console, args.json)
    plan = plan_for(cfg)
    if args.json:
        print(json.dumps(plan.to_dict(), indent=1, default=str))
    else:
        render(plan, console)
    return EXIT_OK if plan.fits else EXIT_FAILED

