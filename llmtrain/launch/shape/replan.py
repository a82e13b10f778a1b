"""The layout of a start on `nnodes` nodes when the run asked for cluster.nnodes (a node down, excluded or
unreachable, or back again).

The rule, in order:
1. the same tp x pp x cp (and ep, zero, recompute, micro-batch size) with dp from the ranks there are, when that is
   a valid layout and fits by `llmtrain plan`'s memory model;
2. else the fastest layout of those ranks that fits (plan --suggest's search);
3. else nothing: ConfigError naming cluster.min_nnodes.
train.global_batch_size is always kept (each dp rank accumulates more micro-batches), so the losses stay those of
the full-size run: the sample stream and initialization do not depend on the layout. A micro-batch size that no
longer divides a dp rank's share is fitted again (config/batch.py's rule).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from llmtrain.config import ConfigError, validate
from llmtrain.config.batch import auto_micro_batch
from llmtrain.parallel.layout import ParallelDims

KEY = "cluster.min_nnodes"
# The keys a re-plan may set; a start's record holds the changed ones.
LAYOUT_KEYS = ("cluster.nnodes", "parallel.dp", "parallel.dp_shard", "parallel.tp", "parallel.pp", "parallel.cp",
               "parallel.ep", "parallel.zero", "parallel.sequence_parallel", "parallel.virtual_stages",
               "parallel.pp_schedule", "parallel.pp_layers", "recompute.mode", "recompute.every",
               "train.micro_batch_size")


@dataclass(frozen=True)
class StartShape:
    nnodes: int
    # dotted key -> value, applied on top of RUN_DIR/config.yaml for this start ({}: the config as it is)
    overrides: dict = field(default_factory=dict)
    # "same tp x pp" | "re-planned" | "as configured"
    how: str = "as configured"

    def to_record(self) -> dict:
        return {"nnodes": self.nnodes, "overrides": dict(self.overrides), "how": self.how}


def get_key(cfg, dotted: str):
    section, key = dotted.split(".")
    return cfg[section][key]


def set_key(cfg, dotted: str, value) -> None:
    section, key = dotted.split(".")
    cfg[section][key] = value


def with_overrides(cfg, overrides: dict):
    """A copy of `cfg` with a start's overrides applied."""
    c = cfg.copy()
    for dotted, value in overrides.items():
        set_key(c, dotted, value)
    return c


def _peak_fits(cfg) -> bool:
    """Whether the plan's peak per rank fits the hardware profile's memory (always, when that is not known)."""
    from llmtrain.hardware import profiles
    from llmtrain.launch.preflight import planned_peak_bytes

    memory = profiles.resolve(cfg.hardware, cfg.precision.compute_dtype, profiles.load_profile)["memory_gib"]
    return not memory or planned_peak_bytes(cfg) <= memory * 2**30


def _valid(cfg) -> bool:
    try:
        validate(cfg)
    except ConfigError:
        return False
    return True


def same_layout(cfg, nnodes: int):
    """`cfg` on `nnodes` nodes with its tp, pp, cp, ep, zero and recompute kept and dp from the ranks there are;
    None when the ranks do not divide by tp x pp x cp."""
    c = cfg.copy()
    p, t = c.parallel, c.train
    ranks = nnodes * c.cluster.nproc_per_node
    if ranks % (p.tp * p.pp * p.cp):
        return None
    c.cluster.nnodes = nnodes
    p.dp = ranks // (p.tp * p.pp * p.cp)
    if p.dp_shard is not None and (p.dp_shard > p.dp or p.dp % p.dp_shard):
        p.dp_shard = None  # the hybrid split no longer divides: shard over all of dp
    if t.global_batch_size % (t.micro_batch_size * p.dp):
        t.micro_batch_size = auto_micro_batch(t.global_batch_size, p.dp, p.pp, p.virtual_stages)
    return c


def searched_layout(cfg, nnodes: int):
    """The fastest layout of nnodes x nproc_per_node ranks that fits, as a config; None when none does."""
    from llmtrain.plan.cli import plan_hardware
    from llmtrain.plan.search import Search, set_layout

    speed, hw = plan_hardware(cfg)
    memory = hw["memory_gib"]
    per_node = cfg.cluster.nproc_per_node
    search = Search(cfg, nnodes * per_node, per_node, speed * 1e12, memory * 2**30 if memory else None, hw)
    found, _ = search.suggested(1)
    if not found:
        return None
    c = cfg.copy()
    set_layout(c, nnodes * per_node, per_node, found[0].layout)
    return c


def replan(cfg, nnodes: int) -> StartShape:
    """The shape of a start on `nnodes` nodes (module docstring); raises ConfigError naming cluster.min_nnodes when
    no layout of those nodes is valid and fits."""
    if nnodes == cfg.cluster.nnodes:
        return StartShape(nnodes)
    kept = same_layout(cfg, nnodes)
    how = "same tp x pp"
    if kept is None or not _valid(kept) or not _peak_fits(kept):
        kept, how = searched_layout(cfg, nnodes), "re-planned"
    if kept is None:
        ranks = nnodes * cfg.cluster.nproc_per_node
        raise ConfigError(KEY, f"on {nnodes} node(s) ({ranks} ranks) no layout is valid and fits by llmtrain plan's "
                               f"memory model (try llmtrain plan --suggest {ranks}); raise cluster.min_nnodes")
    changed = {k: get_key(kept, k) for k in LAYOUT_KEYS if get_key(kept, k) != get_key(cfg, k)}
    return StartShape(nnodes, changed, how)


def degrees(cfg) -> str:
    return ParallelDims.from_config(cfg).degrees


def shape_line(cfg, shape: StartShape, hosts: list[str] | None = None, why: str | None = None) -> str:
    """What a start on fewer (or again all) nodes changed and why, in one line."""
    new = with_overrides(cfg, shape.overrides)
    on = f" ({', '.join(hosts)})" if hosts else ""
    missing = f"; {why}" if why else ""
    t_old, t_new = cfg.train, new.train
    accumulate = (t_old.global_batch_size // (t_old.micro_batch_size * cfg.parallel.dp),
                  t_new.global_batch_size // (t_new.micro_batch_size * new.parallel.dp))
    return (f"llmtrain: this start has {shape.nnodes} of {cfg.cluster.nnodes} nodes{on}{missing}: {shape.how}, "
            f"{degrees(cfg)} -> {degrees(new)}, micro-batches per rank {accumulate[0]} -> {accumulate[1]}, "
            f"global batch {t_new.global_batch_size} kept")
