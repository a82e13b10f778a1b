"""When a plan does not fit: the smallest change of layout that does, among `llmtrain plan --suggest`'s
candidates on the configured devices (tp, pp, zero, recompute, a mixture of experts' ep; sequence parallel with
tp > 1). Smallest = the fewest of those keys changed; among equals, the fastest estimate. dp follows tp x pp (with
the candidates' plain 1F1B schedule), and the batch is kept: named with a change of dp, so that a batch key left
null (derived from the layout) cannot change with it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

# What the search varies: a change's size is how many of these it sets.
SIZED = ("parallel.tp", "parallel.pp", "parallel.ep", "parallel.zero", "parallel.sequence_parallel", "recompute.mode")
# Every key a candidate may change, in the order a change names them (the others follow the sized ones).
ORDER = ("parallel.tp", "parallel.pp", "parallel.cp", "parallel.dp", "parallel.dp_shard", "parallel.ep",
         "parallel.zero", "parallel.sequence_parallel", "parallel.virtual_stages", "parallel.pp_schedule",
         "parallel.pp_layers", "recompute.mode", "recompute.every")
BATCH = ("train.global_batch_size", "train.micro_batch_size")


@dataclass
class FitChange:
    overrides: list[str]  # key=value, what to add to the command
    plan: object  # the Plan with the change


def _get(cfg, key: str):
    section, name = key.split(".")
    return cfg[section][name]


def _value(v) -> str:
    return "null" if v is None else str(v).lower() if isinstance(v, bool) else str(v)


def overrides_of(cfg, changed) -> list[str]:
    """What turns `cfg` into `changed`, as overrides; [] when no sized key differs."""
    if all(_get(cfg, key) == _get(changed, key) for key in SIZED):
        return []
    keys = [key for key in ORDER if _get(cfg, key) != _get(changed, key)]
    out = [f"{key}={_value(_get(changed, key))}" for key in keys]
    if "parallel.dp" in keys:  # the batch the plan kept, whatever a null batch key would derive from the new dp
        out += [f"{key}={_get(changed, key)}" for key in BATCH]
    return out


def smallest(cfg, layouts: list, valid: Callable, plan_of: Callable) -> FitChange | None:
    """The fitting layout that changes the fewest sized keys of `cfg`, fastest first among equals; None when none
    fits. `layouts`: (layout, config_of) pairs, config_of(layout) the config with it (possibly one object reused);
    smaller changes are tried first, and once one fits no larger one is planned."""
    sized = []
    for layout, config_of in layouts:
        overrides = overrides_of(cfg, config_of(layout))
        if overrides:
            sized.append((sum(1 for o in overrides if o.split("=", 1)[0] in SIZED), layout, config_of))
    best, best_key = None, None
    for size, layout, config_of in sorted(sized, key=lambda t: t[0]):
        if best_key is not None and size > best_key[0]:
            break
        changed = config_of(layout)
        if not valid(changed):
            continue
        plan = plan_of(changed)
        if plan.fits and (best_key is None or (size, -plan.tokens_per_s) < best_key):
            best, best_key = FitChange(overrides_of(cfg, changed), plan), (size, -plan.tokens_per_s)
    return best
