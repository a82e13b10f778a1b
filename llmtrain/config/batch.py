"""The global batch and how it is divided: a number of samples per optimizer step that does not depend on the layout,
split into micro-batches on each dp rank (accumulation = global / (micro x dp)).

train.global_batch_size=null is the default (DEFAULT_GLOBAL_BATCH_SIZE) on a fresh run and the checkpoint's value on
a resume (launch/resumed_batch.py), so dp, tp, pp or the number of nodes never change the samples of a step unless
the user sets it. train.micro_batch_size=null fits the micro-batch to each dp rank's share instead: a memory knob,
free to follow the layout."""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from llmtrain.config.schema import DEFAULT_GLOBAL_BATCH_SIZE, MAX_AUTO_MICRO_BATCH_SIZE

GLOBAL_KEY = "train.global_batch_size"
MICRO_KEY = "train.micro_batch_size"
FILLED_KEYS = (GLOBAL_KEY, MICRO_KEY)

# Where a run's global batch came from, as the trainer's launch line says it.
ORIGIN_WORDS = {"default": "from the config default", "config": "from your config",
                "override": "from your override", "checkpoint": "kept from the checkpoint"}


def batch_words(origin: str | None, global_batch: int) -> str:
    """`train.global_batch_size=16 from the config default; ` for the trainer's launch line; "" when unknown."""
    return f"{GLOBAL_KEY}={global_batch} {ORIGIN_WORDS[origin]}; " if origin in ORIGIN_WORDS else ""


def origins(raw: DictConfig, overrides) -> dict[str, str]:
    """{key: default | config | override} for FILLED_KEYS: unset in the composed YAML (null), set by a config
    file, or set on the command line."""
    named = {o.partition("=")[0].lstrip("+~") for o in overrides}
    out = {}
    for key in FILLED_KEYS:
        if OmegaConf.select(raw, key, default=None) is None:
            out[key] = "default"
        else:
            out[key] = "override" if key in named else "config"
    return out


def fill(cfg: DictConfig, fill_micro: bool) -> None:
    """A null global batch takes the default; a null micro-batch size (with fill_micro, one filled before) is fitted
    to the global batch."""
    t, p = cfg.train, cfg.parallel
    if t.global_batch_size is None:
        t.global_batch_size = DEFAULT_GLOBAL_BATCH_SIZE
    if t.micro_batch_size is None or fill_micro:
        usable = p.dp is not None and p.dp > 0 and p.pp > 0 and p.virtual_stages > 0  # else validation names them
        t.micro_batch_size = auto_micro_batch(t.global_batch_size, p.dp, p.pp, p.virtual_stages) if usable \
            else MAX_AUTO_MICRO_BATCH_SIZE


def auto_micro_batch(global_batch: int, dp: int, pp: int = 1, virtual_stages: int = 1) -> int:
    """The largest micro-batch of at most MAX_AUTO_MICRO_BATCH_SIZE samples that divides a dp rank's share; with a
    pipeline, one that leaves 2 x pp x virtual_stages micro-batches (the 1F1B bubble (pp-1)/(m+pp-1) <= 1/3), else
    at least pp, a multiple of pp. 1 when nothing divides (validation then names the keys)."""
    if global_batch < 1 or dp < 1 or global_batch % dp:
        return 1
    share = global_batch // dp
    sizes = [m for m in range(min(MAX_AUTO_MICRO_BATCH_SIZE, share), 0, -1) if share % m == 0]
    if pp > 1:
        wanted = [m for m in sizes if share // m >= 2 * pp * virtual_stages and (share // m) % pp == 0]
        enough = [m for m in sizes if share // m >= pp and (share // m) % pp == 0]
        sizes = wanted or enough or [1]
    return sizes[0]


def widen_default_for_layout(cfg: DictConfig, origin: dict[str, str]) -> str | None:
    """For the commands that look at a layout instead of training it (plan, tune, doctor): a default global batch
    that this layout's dp ranks cannot share is widened to the smallest multiple of dp (x pp, for a pipeline's
    micro-batches) that they can, and the line saying so is returned. A global batch the user set, or a checkpoint
    keeps, is never changed: a launch refuses it instead (validate's one line)."""
    t, p = cfg.train, cfg.parallel
    if origin.get(GLOBAL_KEY) != "default" or not p.dp or p.dp < 1 or p.pp < 1:
        return None
    if division_problem(t.global_batch_size, t.micro_batch_size, p.dp) is None:
        return None
    fitted_micro = origin.get(MICRO_KEY) == "default"
    step = p.dp * (p.pp if fitted_micro else t.micro_batch_size)
    default, t.global_batch_size = t.global_batch_size, -(-t.global_batch_size // step) * step
    if fitted_micro:
        t.micro_batch_size = auto_micro_batch(t.global_batch_size, p.dp, p.pp, p.virtual_stages)
    return (f"{GLOBAL_KEY}: the default {default} does not divide over parallel.dp={p.dp}; using "
            f"{t.global_batch_size} here (a launch needs it set: {GLOBAL_KEY}=N)")


def division_problem(global_batch: int, micro: int, dp: int) -> str | None:
    """Why `global_batch` samples do not divide into micro-batches of `micro` on `dp` ranks, with the values that
    would (one line), or None."""
    per_step = micro * dp
    if global_batch % per_step == 0:
        return None
    fixes = [f"{GLOBAL_KEY} to a multiple of {per_step} ({per_step}, {2 * per_step}, {3 * per_step}, ...)"]
    if global_batch % dp == 0:
        share = global_batch // dp
        fixes.append(f"{MICRO_KEY} to {_either([m for m in range(1, share + 1) if share % m == 0])}")
    dps = [d for d in range(1, global_batch // micro + 1) if global_batch % (micro * d) == 0]
    if dps:
        fixes.append(f"parallel.dp to {_either(dps)} (processes = dp x tp x pp)")
    return (f"{GLOBAL_KEY}={global_batch} is not a multiple of {MICRO_KEY} x parallel.dp = {micro} x {dp} = "
            f"{per_step}: set {'; or '.join(fixes)}")


def _either(values: list[int]) -> str:
    """`1, 2, 3 or 6`; at most eight values, then `...`."""
    shown = [str(v) for v in values[:8]]
    if len(values) > 8:
        return ", ".join(shown) + ", ..."
    return shown[0] if len(shown) == 1 else ", ".join(shown[:-1]) + " or " + shown[-1]
