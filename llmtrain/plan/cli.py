"""`llmtrain plan [OVERRIDES] [--json] [--suggest [N_GPUS GIB]]`: what the composed config costs, before launch."""

from __future__ import annotations

import argparse
import json

from rich.console import Console

from llmtrain.config import ConfigError, validate
from llmtrain.console import fold_table, get_console, plain
from llmtrain.errors import EXIT_FAILED, EXIT_OK
from llmtrain.hardware import profiles as hardware
from llmtrain.plan import calibration, fit_change
from llmtrain.plan.estimate import build_plan
from llmtrain.plan.params import active_params, stage_params
from llmtrain.plan.search import expert_degrees
from llmtrain.plan.suggest import suggest


def add_plan_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the plan as JSON (for scripts)")
    parser.add_argument("--suggest", nargs="*", metavar="N_GPUS GIB", type=float, default=None,
                        help="rank the layouts (tp, pp, cp, zero, recompute, micro-batch; ep for a mixture of "
                             "experts) that fit the config's devices and the hardware profile's memory, or N_GPUS "
                             "devices of GIB GiB")


def plan_hardware(cfg, calibrated: bool = True) -> tuple[float, dict]:
    """(the speed a step is timed at, in TFLOPS; the hardware profile, with the factors `llmtrain tune` fitted for
    it and the model family when there are any (calibrated=False: the profile's assumptions)). A CPU without a
    given peak is timed at its matmul speed measured now, and its plan has no MFU."""
    hw = hardware.resolve(cfg.hardware, cfg.precision.compute_dtype, hardware.load_profile)
    speed = hw["peak_tflops"]
    if speed is None and hw["name"] == "cpu":
        speed = hardware.measured_cpu_tflops()
        hw = {**hw, "measured_tflops": speed, "compute_dtype": cfg.precision.compute_dtype}
    if speed is None:  # a plan's step time needs a peak (training only goes without MFU)
        raise ConfigError("hardware", hardware.missing_peak(hw, cfg.precision.compute_dtype))
    found = calibration.lookup(hw["name"], calibration.family(cfg.model)) if calibrated else None
    if found is not None:
        hw = {**hw, "efficiency": found.efficiency, "comm_factor": found.comm_factor, "calibration": found.line()}
    return speed, hw


def plan_for(cfg, memory_gib: float | None = None, calibrated: bool = True):
    """The plan of `cfg` (plan_hardware's speed and profile); against `memory_gib` per device when given, else the
    profile's memory."""
    speed, hw = plan_hardware(cfg, calibrated)
    memory = memory_gib if memory_gib is not None else hw["memory_gib"]
    return build_plan(cfg, speed * 1e12, memory * 2**30 if memory else None, hw)


def estimate_basis(hw: dict) -> str:
    """What the plan's speed rests on: tune's calibration for this profile and family, or the assumption."""
    of = "of peak" if "measured_tflops" not in hw else \
        f"of this CPU's matmul speed measured now ({hw['measured_tflops']:.3g} TFLOPS)"
    if hw.get("calibration"):
        return f"{hw['calibration']}: matmuls at {hw['efficiency']:.1%} {of}"
    return f"assumes matmuls at {hw['efficiency']:.0%} {of}"


def mfu_cell(plan) -> str:
    """The plan's MFU, labelled as the estimate it is."""
    return f"~{plan.mfu:.0%} of {plan.hardware['peak_tflops']:,.1f} TFLOPS/device ({estimate_basis(plan.hardware)})"


def no_mfu_line(plan) -> str:
    """Why a plan shows no MFU: no known peak (a CPU's, unless given)."""
    return f"est. MFU not shown: {hardware.missing_peak(plan.hardware, plan.hardware['compute_dtype'])}"


def _gib(x: float) -> str:
    return f"{x / 2**30:,.2f}"


def active_cell(total: int, active: int) -> str | None:
    """A mixture of experts' active count against its total; None for a dense model (all active)."""
    if active == total:
        return None
    return f"{active:,} per token ({active / total:.1%} of the total: top_k of each sparse layer's routed experts)"


def parameters_line(total: int, active: int) -> str:
    """`--suggest`'s line on the model: its total and, for a mixture of experts, its active count."""
    return f"parameters: {total:,}" + (f" total, {active:,} active per token" if active != total else "")


def all_to_all_cell(plan) -> str:
    """A mixture of experts' all-to-all traffic per step per rank (expert parallel), and its exposed time."""
    ep = plan.dims["ep"]
    if ep == 1:
        return "none (ep=1: every rank holds every expert)"
    share = f"{ep - 1}/{ep}"
    return (f"{plan.all_to_all_bytes_per_step / 1e9:,.3f} GB per rank ({share} of it leaves the rank: "
            f"est. {plan.all_to_all_s:,.3f} s, exposed)")


def render(plan, console: Console) -> None:
    d = plan.dims
    summary = fold_table("plan", show_header=False)
    summary.add_column(style="bold")
    summary.add_column()
    active = active_cell(plan.params_total, plan.params_active)
    rows = [
        ("parameters", f"{plan.params_total:,} ({plan.params_non_embedding:,} non-embedding)"),
        *((("active parameters", active),) if active else ()),
        ("layout", f"dp={d['dp']} (shard {d['dp_shard']}) cp={d['cp']} tp={d['tp']} pp={d['pp']} "
                   f"x v{d['virtual_stages']} ep={d['ep']} zero={d['zero']} schedule={d['schedule']} "
                   f"recompute={d['recompute']}"
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
        *((("all-to-all per step", all_to_all_cell(plan)),) if plan.params_active != plan.params_total else ()),
        ("est. step time", f"{plan.step_time_s:,.3f} s"),
        ("est. tokens/s", f"{plan.tokens_per_s:,.0f}"),
    ]
    if plan.mfu is not None:
        rows.append(("est. MFU", mfu_cell(plan)))
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
    if plan.mfu is None:
        plain(no_mfu_line(plan), console=console)


def layouts(cfg, n_gpus: int, per_node: int):
    """(tp, pp, zero, recompute, ep) of every layout for n_gpus devices, per_node of them on each node: tp within
    a node, pp dividing the layers, every zero and recompute, and a mixture of experts' ep (expert_degrees)."""
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
                    for ep in expert_degrees(cfg, n_gpus // (tp * pp)):
                        yield tp, pp, zero, recompute, ep


def set_layout(c, n_gpus: int, per_node: int, tp: int, pp: int, zero: int, recompute: str, ep: int = 1,
               cp: int = 1) -> None:
    """Give config `c` (in place) a layout of `layouts`: dp the rest of the devices, sequence parallel with tp,
    the plain 1F1B schedule."""
    c.cluster.nproc_per_node, c.cluster.nnodes = per_node, n_gpus // per_node
    c.parallel.tp, c.parallel.pp, c.parallel.zero, c.parallel.ep, c.parallel.cp = tp, pp, zero, ep, cp
    c.parallel.dp, c.parallel.dp_shard, c.parallel.virtual_stages = n_gpus // (tp * pp * cp), None, 1
    c.parallel.pp_schedule, c.parallel.pp_layers = "1f1b", None
    c.parallel.sequence_parallel = tp > 1
    c.recompute.mode, c.recompute.every = recompute, 1


def is_valid(c) -> bool:
    try:
        validate(c)
    except ConfigError:
        return False
    return True


def candidates(cfg, n_gpus: int, per_node: int | None = None):
    """The valid layouts for n_gpus devices, per_node of them on each node (default: up to 8), each a config."""
    per_node = per_node or min(8, n_gpus)
    for layout in layouts(cfg, n_gpus, per_node):
        c = cfg.copy()
        set_layout(c, n_gpus, per_node, *layout)
        if is_valid(c):
            yield c


def run_plan(cfg, args) -> int:
    console = get_console()
    if args.suggest is not None:
        speed, hw = plan_hardware(cfg)
        _, total, _ = stage_params(cfg)
        return suggest(cfg, args.suggest, speed, hw, console, args.json,
                       parameters_line(total, active_params(cfg, total)), estimate_basis(hw), no_mfu_line)
    plan = plan_for(cfg)
    change = None if plan.fits else smallest_fitting_change(cfg, plan)
    if args.json:
        print(json.dumps({**plan.to_dict(), "fits_with": change.overrides if change else None}, indent=1,
                         default=str))
    else:
        render(plan, console)
        if not plan.fits:
            plain(fit_line(cfg, plan, change), console=console)
    return EXIT_OK if plan.fits else EXIT_FAILED


def smallest_fitting_change(cfg, plan):
    """The layout change that fits with the fewest keys (plan/fit_change.py), on the configured devices."""
    per_node = cfg.cluster.nproc_per_node
    n = cfg.cluster.nnodes * per_node
    memory = plan.hardware["memory_gib"]
    if not memory:
        return None
    work = cfg.copy()  # each layout in turn (a copy each would cost more than its plan)

    def each(layout):
        set_layout(work, n, per_node, *layout)
        return work

    def fits(layout) -> bool:
        c = each(layout)
        return not is_valid(c) or plan_for(c, memory_gib=memory).fits

    # zero 3 with full recompute needs the least memory of a (tp, pp) (with a mixture of experts: at one of its
    # ep): where none fits, nothing else of that pair is planned (where validate refuses one, the pair is searched)
    all_layouts = list(layouts(cfg, n, per_node))
    pairs = {layout[:2] for layout in all_layouts if layout[2:4] == (3, "full") and fits(layout)}
    return fit_change.smallest(cfg, [(layout, each) for layout in all_layouts if layout[:2] in pairs],
                               is_valid, lambda c: plan_for(c, memory_gib=memory))


def fit_line(cfg, plan, change) -> str:
    """What to change when the plan does not fit: the smallest change that does, or that no layout does."""
    n = cfg.cluster.nnodes * cfg.cluster.nproc_per_node
    memory = plan.hardware["memory_gib"]
    need = f"{_gib(plan.peak_bytes_per_rank)} GiB per rank > {memory:,.1f} GiB"
    if change is None:
        return (f"does not fit ({need}) and no layout of {n} devices does; try more devices, a smaller "
                "train.micro_batch_size or a shorter model.seq_len")
    p = change.plan
    return (f"does not fit ({need}); the smallest change that fits: {' '.join(change.overrides)} "
            f"({_gib(p.peak_bytes_per_rank)} GiB per rank, est. {p.tokens_per_s:,.0f} tokens/s); "
            f"--suggest {n} {memory:g} ranks every layout that fits")
