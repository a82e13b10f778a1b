"""The layouts a tune measures: `llmtrain plan --suggest`'s candidates (tp, pp, zero, recompute, and for a mixture
of experts ep) on the configured nodes, each with every context-parallel degree cp that divides its data-parallel
ranks and seq_len / 2 (dp the rest), with a half and a double micro-batch and, with a pipeline, the interleaved
schedule over two virtual stages; the global batch stays the configured one. Ranked by the plan's estimated
tokens/s (calibrated when tune measured this hardware and model family before); the top K that fit a device are
the trials.
train.compile and optim.fused stay as configured: the plan has no figure for them to rank by (refine.py measures
them)."""

from __future__ import annotations

from dataclasses import dataclass

from omegaconf import DictConfig

from llmtrain.config import ConfigError, validate
from llmtrain.plan.cli import candidates as plan_candidates
from llmtrain.plan.cli import plan_for
from llmtrain.plan.estimate import Plan
from llmtrain.plan.search import context_degrees

# The keys a layout sets, with the short names its folder is named by (parallel.ep: a mixture of experts' only;
# parallel.cp: a layout with cp > 1, or every layout of a config with cp > 1).
LAYOUT_KEYS = {"parallel.dp": "dp", "parallel.tp": "tp", "parallel.pp": "pp", "parallel.cp": "cp", "parallel.ep": "ep",
               "parallel.virtual_stages": "v",
               "parallel.pp_schedule": "", "parallel.zero": "zero", "parallel.sequence_parallel": "sp",
               "train.micro_batch_size": "mb", "recompute.mode": "rc"}


@dataclass
class Layout:
    values: dict  # LAYOUT_KEYS key -> value
    cfg: DictConfig  # the composed config with this layout
    refines: str = ""  # a refinement (refine.py): the name of the layout it switches one key of
    suffix: str = ""  # what the refinement's name adds to that layout's

    @property
    def name(self) -> str:
        if self.refines:
            return self.refines + self.suffix
        v = self.values
        parts = [f"dp{v['parallel.dp']}", f"tp{v['parallel.tp']}", f"pp{v['parallel.pp']}"]
        if v["parallel.pp"] > 1:
            parts.append(f"{v['parallel.pp_schedule']}" + (f"-v{v['parallel.virtual_stages']}"
                                                           if v["parallel.virtual_stages"] > 1 else ""))
        if v.get("parallel.cp", 1) > 1:  # cp=1 layouts keep the names they had before cp
            parts.append(f"cp{v['parallel.cp']}")
        if "parallel.ep" in v:
            parts.append(f"ep{v['parallel.ep']}")
        parts += [f"zero{v['parallel.zero']}", f"mb{v['train.micro_batch_size']}", f"rc-{v['recompute.mode']}"]
        return "-".join(parts)

    @property
    def overrides(self) -> list[str]:
        return [f"{key}={_hydra(value)}" for key, value in self.values.items()]


def layout_keys(cfg: DictConfig, config_cp: int = 1) -> list[str]:
    """The LAYOUT_KEYS a config's layouts set: parallel.ep only for a mixture of experts (a dense model's is 1),
    parallel.cp only where it or the tuned config's (`config_cp`) is > 1, so a dense model's cp=1 layouts keep
    their names and overrides."""
    return [key for key in LAYOUT_KEYS if (key != "parallel.ep" or cfg.model.moe is not None)
            and (key != "parallel.cp" or max(cfg.parallel.cp, config_cp) > 1)]


def _hydra(value) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


@dataclass
class Ranked:
    layout: Layout
    plan: Plan  # calibrated when a calibration exists


def layouts(cfg: DictConfig):
    """Every valid layout of the configured nodes, global batch and model."""
    nodes, per_node = cfg.cluster.nnodes, cfg.cluster.nproc_per_node
    seen = set()
    for base in plan_candidates(cfg, nodes * per_node, per_node):
        mb = base.train.micro_batch_size
        for cp in context_degrees(base, base.parallel.dp):
            for micro in sorted({max(1, mb // 2), mb, mb * 2}):
                for schedule, virtual in _schedules(base):
                    c = base.copy()
                    c.parallel.cp, c.parallel.dp = cp, base.parallel.dp // cp
                    c.train.micro_batch_size = micro
                    c.parallel.pp_schedule, c.parallel.virtual_stages = schedule, virtual
                    try:
                        validate(c)
                    except ConfigError:
                        continue
                    layout = Layout({key: _get(c, key) for key in layout_keys(c, cfg.parallel.cp)}, c)
                    if layout.name not in seen:
                        seen.add(layout.name)
                        yield layout


def _schedules(cfg: DictConfig) -> list[tuple[str, int]]:
    if cfg.parallel.pp == 1:
        return [("1f1b", 1)]
    out = [("1f1b", 1)]
    if cfg.model.n_layers % (2 * cfg.parallel.pp) == 0:
        out.append(("interleaved_1f1b", 2))
    return out


def _get(cfg: DictConfig, key: str):
    section, name = key.split(".")
    return cfg[section][name]


def device_memory_bytes(plan: Plan, cfg: DictConfig) -> tuple[float, int] | None:
    """(memory, ranks sharing it): a CPU's ranks share the machine's memory, a GPU rank has its device."""
    gib = plan.hardware["memory_gib"]
    if not gib:
        return None
    return gib * 2**30, cfg.cluster.nproc_per_node if plan.hardware["name"] == "cpu" else 1


def memory_short(plan: Plan, cfg: DictConfig) -> str | None:
    """Why the ranks of a node would not fit its memory, or None. The plan's fit is per device; on a CPU the
    node's ranks share one memory, so a layout the plan lets through may still not fit there."""
    memory = device_memory_bytes(plan, cfg)
    if memory is None or plan.peak_bytes_per_rank * memory[1] <= memory[0]:
        return None
    need = plan.peak_bytes_per_rank * memory[1] / 2**30
    return f"plan: {need:,.2f} GiB{f' for {memory[1]} ranks' if memory[1] > 1 else ''} > {memory[0] / 2**30:,.2f} GiB"


def ranked(cfg: DictConfig, calibrated: bool = True) -> list[Ranked]:
    """Every layout with its plan, fastest estimate first (ties: the layout's name, so the order is fixed)."""
    out = []
    for layout in layouts(cfg):
        plan = plan_for(layout.cfg, calibrated=calibrated)
        out.append(Ranked(layout, plan))
    out.sort(key=lambda r: (-r.plan.tokens_per_s, r.layout.name))
    return out


def top(ranking: list[Ranked], k: int) -> list[Ranked]:
    """The k fastest estimates among the layouts the plan says fit a device (as `plan --suggest` ranks them)."""
    return [r for r in ranking if r.plan.fits][:k]
