"""`plan --suggest`'s search: every layout of N devices users tune (tp, pp, cp, zero, recompute, micro-batch; ep for
a mixture of experts), planned fast and pruned where the plan's own memory model says a whole branch cannot fit.

Pruning (each step only skips layouts that need at least as much memory as one that did not fit, or that are
slower and no smaller than one that fits):
- per (tp, pp, cp, ep) and ZeRO level, from zero 3 to 2 to 0: when zero 3 with full recompute at the smallest
  micro-batch does not fit, no other level will;
- per micro-batch, smallest first: the least recompute that fits is kept (more recompute is slower and the same
  layout otherwise); when full recompute does not fit, no larger micro-batch will.
Plans run on a plain copy of the config (plain.py). Validity: the rules of config.validate's sections that a
layout can break (cluster, parallel, train, precision, optim) run once per (tp, pp, cp, ep, zero) at its smallest
micro-batch, and the micro-batch's own rules (global batch divisible by micro x dp, pipelines' micro-batches >= pp)
are checked directly; `suggested` validates each layout it returns in full.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmtrain.config import ConfigError, validate
from llmtrain.config.validate import SECTIONS
from llmtrain.plan.estimate import Plan, build_plan
from llmtrain.plan.plain import plain

LAYOUT_SECTIONS = ("cluster", "parallel", "train", "precision", "optim")
RECOMPUTE = ("none", "selective", "full")  # least memory last


@dataclass(frozen=True)
class Layout:
    tp: int
    pp: int
    cp: int
    ep: int
    zero: int
    recompute: str
    micro: int


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def expert_degrees(cfg, dp: int) -> list[int]:
    """The ep a layout with `dp` data-parallel ranks may take: for a mixture of experts every divisor of
    model.moe.n_experts that divides dp (validate() has the last word); 1 for a dense model."""
    moe = cfg.model.moe
    if moe is None:
        return [1]
    return [ep for ep in range(1, dp + 1) if dp % ep == 0 and moe.n_experts % ep == 0]


def context_degrees(cfg, rest: int) -> list[int]:
    """The cp of `rest` devices (world / (tp x pp)): divisors of rest that divide seq_len / 2."""
    if cfg.model.seq_len % 2:
        return [1]
    return [cp for cp in divisors(rest) if (cfg.model.seq_len // 2) % cp == 0]


def micro_batches(global_batch: int, dp: int) -> list[int]:
    """The micro-batch sizes that keep the global batch divisible by micro x dp, smallest first."""
    if global_batch % dp:
        return []
    return divisors(global_batch // dp)


def set_layout(c, n_gpus: int, per_node: int, layout: Layout) -> None:
    """Give config `c` (DictConfig or Plain, in place) the layout: dp the rest of the devices, sequence parallel
    with tp, the plain 1F1B schedule."""
    c.cluster.nproc_per_node, c.cluster.nnodes = per_node, n_gpus // per_node
    c.parallel.tp, c.parallel.pp, c.parallel.zero, c.parallel.ep = layout.tp, layout.pp, layout.zero, layout.ep
    c.parallel.cp = layout.cp
    c.parallel.dp, c.parallel.dp_shard, c.parallel.virtual_stages = n_gpus // (layout.tp * layout.pp * layout.cp), \
        None, 1
    c.parallel.pp_schedule, c.parallel.pp_layers = "1f1b", None
    c.parallel.sequence_parallel = layout.tp > 1
    c.recompute.mode, c.recompute.every = layout.recompute, 1
    c.train.micro_batch_size = layout.micro


def overrides(layout: Layout, n_gpus: int, per_node: int) -> list[str]:
    """The keys a suggested layout sets, as command-line overrides."""
    return [f"cluster.nnodes={n_gpus // per_node}", f"cluster.nproc_per_node={per_node}",
            f"parallel.tp={layout.tp}", f"parallel.pp={layout.pp}", f"parallel.cp={layout.cp}",
            *((f"parallel.ep={layout.ep}",) if layout.ep > 1 else ()), f"parallel.zero={layout.zero}",
            f"parallel.sequence_parallel={str(layout.tp > 1).lower()}", f"recompute={layout.recompute}",
            f"train.micro_batch_size={layout.micro}"]


def undominated(plans: list[Plan]) -> list[Plan]:
    """Drops a plan when the same layout at another micro-batch size is as fast with no more memory."""
    best: dict[tuple, list[Plan]] = {}
    for p in plans:
        lay = p.layout
        best.setdefault((lay.tp, lay.pp, lay.cp, lay.ep, lay.zero, lay.recompute), []).append(p)

    def dominated(p: Plan, others: list[Plan]) -> bool:  # speeds within 1e-6 (float rounding) count as equal
        return any(o is not p and o.tokens_per_s >= p.tokens_per_s * (1 - 1e-6)
                   and o.peak_bytes_per_rank <= p.peak_bytes_per_rank
                   and (o.tokens_per_s > p.tokens_per_s * (1 + 1e-6) or o.peak_bytes_per_rank < p.peak_bytes_per_rank)
                   for o in others)

    return [p for group in best.values() for p in group if not dominated(p, group)]


class Search:
    """Plans of one config's layouts on n_gpus devices (per_node to a node) against `memory_bytes` each."""

    def __init__(self, cfg, n_gpus: int, per_node: int, peak_flops: float, memory_bytes: float, hw: dict):
        self.cfg, self.n, self.per_node = cfg, n_gpus, per_node
        self.base = plain(cfg)
        self.peak_flops, self.memory, self.hw = peak_flops, memory_bytes, hw
        self.planned = 0
        self._valid: dict[tuple, bool] = {}
        self._work = cfg.copy()  # one config that each check sets in turn: a copy costs more than the check

    def plan(self, layout: Layout) -> Plan:
        c = self.base.copy()
        set_layout(c, self.n, self.per_node, layout)
        self.planned += 1
        return build_plan(c, self.peak_flops, self.memory, self.hw)

    def layout_valid(self, layout: Layout) -> bool:
        """The layout-dependent rules, once per (tp, pp, cp, ep, zero), and the micro-batch's own."""
        dp = self.n // (layout.tp * layout.pp * layout.cp)
        micro_count = self.cfg.train.global_batch_size // (layout.micro * dp)
        if self.cfg.train.global_batch_size % (layout.micro * dp) or (layout.pp > 1 and micro_count < layout.pp):
            return False
        key = (layout.tp, layout.pp, layout.cp, layout.ep, layout.zero)
        if key not in self._valid:
            c = self.config_of(layout)
            try:
                for name, rule in SECTIONS:
                    if name in LAYOUT_SECTIONS:
                        rule(c)
                self._valid[key] = True
            except ConfigError:
                self._valid[key] = False
        return self._valid[key]

    def groups(self):
        """(tp, pp, cp, ep, micro-batch sizes) of every layout family: tp within a node, pp dividing the layers."""
        m = self.cfg.model
        if self.n % self.per_node:
            return
        for tp in (1, 2, 4, 8):
            if tp > self.per_node:
                continue
            for pp in divisors(m.n_layers):
                if self.n % (tp * pp):
                    continue
                for cp in context_degrees(self.cfg, self.n // (tp * pp)):
                    dp = self.n // (tp * pp * cp)
                    micros = micro_batches(self.cfg.train.global_batch_size, dp)
                    for ep in expert_degrees(self.cfg, dp) if cp == 1 else [1]:  # cp refuses expert parallel
                        if micros:
                            yield tp, pp, cp, ep, micros

    def fitting(self) -> list[Plan]:
        """A plan of every layout that fits and is not dominated (module docstring); each plan's `layout` set."""
        out = []
        for tp, pp, cp, ep, micros in self.groups():
            for zero in (3, 2, 0):
                found = self._zero_level(tp, pp, cp, ep, zero, micros)
                if found is None:  # the least memory of this level does not fit: nor will a lower level's
                    break
                out += found
        return out

    def _zero_level(self, tp, pp, cp, ep, zero, micros) -> list[Plan] | None:
        """The fitting layouts of one ZeRO level; None when even its least memory (full recompute at the smallest
        valid micro-batch) does not fit."""
        out, tried = [], False
        for micro in micros:
            if not self.layout_valid(Layout(tp, pp, cp, ep, zero, "full", micro)):
                continue
            kept = None
            for recompute in RECOMPUTE:
                layout = Layout(tp, pp, cp, ep, zero, recompute, micro)
                plan = self.plan(layout)
                if plan.fits:
                    kept, plan.layout = plan, layout
                    break
            if kept is None:
                return out if tried else None  # full recompute does not fit: no larger micro-batch will
            tried = True
            out.append(kept)
        return out

    def config_of(self, layout: Layout):
        """The composed config with `layout`: one object, changed by the next call."""
        set_layout(self._work, self.n, self.per_node, layout)
        return self._work

    def suggested(self, limit: int) -> tuple[list[Plan], int]:
        """The fastest `limit` layouts that fit, each validated in full, fastest first; and how many fit."""
        ranked = sorted(undominated(self.fitting()), key=lambda p: (-p.tokens_per_s, p.peak_bytes_per_rank))
        out = []
        for plan in ranked:
            if len(out) == limit:
                break
            try:
                validate(self.config_of(plan.layout))
            except ConfigError:
                continue
            out.append(plan)
        return out, len(ranked)
