"""What differs between a checkpoint's config and the config a run resumes with."""

from __future__ import annotations

from omegaconf import DictConfig

from llmtrain.checkpoint.store import CheckpointUsageError
from llmtrain.config.compose import flat_keys, to_plain
from llmtrain.model.registry import family_of

# Keys that fix parameter shapes: resuming with another value cannot load the weights.
SHAPE_KEYS = ("model.arch", "model.n_layers", "model.n_heads", "model.n_kv_heads", "model.d_model", "model.vocab_size",
              "model.vocab_pad_multiple", "model.seq_len", "model.head_dim", "model.ffn_dim",
              "model.ffn_dim_multiplier", "model.multiple_of", "model.tie_embeddings",
              # model.moe null <-> set, and what sizes its experts or places its sparse layers
              "model.moe", "model.moe.n_experts", "model.moe.expert_ffn_dim", "model.moe.n_shared_experts",
              "model.moe.n_dense_layers", "model.moe.sparse_every")
# Fixed by the weights only where the family has a position table: otherwise seq_len may change between launches.
LENGTH_KEY = "model.seq_len"


def shape_keys(cfg: DictConfig) -> tuple[str, ...]:
    """SHAPE_KEYS for the model `cfg` builds."""
    learned_positions = family_of(cfg.model).learned_positions
    return tuple(k for k in SHAPE_KEYS if k != LENGTH_KEY or learned_positions)
# Keys expected to differ between attempts of the same run (a key, or a section ending in ".").
IGNORED = ("checkpoint.resume", "cluster.master_port", "cluster.node_rank", "run.overwrite", "doctor.")


def config_diff(old: DictConfig, new: DictConfig) -> list[tuple[str, object, object]]:
    a, b = flat_keys(to_plain(old)), flat_keys(to_plain(new))
    return [(k, a.get(k, "<absent>"), b.get(k, "<absent>")) for k in sorted(set(a) | set(b))
            if a.get(k, "<absent>") != b.get(k, "<absent>") and not k.startswith(IGNORED)]


def check_positions(old: DictConfig, new: DictConfig, path: str) -> None:
    """A position table (gpt2) holds model.seq_len rows: refused in one line naming model.seq_len when it differs."""
    spec = family_of(new.model)
    if family_of(old.model) is not spec or not spec.learned_positions or old.model.seq_len == new.model.seq_len:
        return
    raise CheckpointUsageError(LENGTH_KEY, f"resuming {path} with model.seq_len {old.model.seq_len} -> "
                                           f"{new.model.seq_len}: model.arch={new.model.arch} learns a position table of "
                                           f"{old.model.seq_len} rows, which cannot grow or shrink; keep "
                                           f"model.seq_len={old.model.seq_len} (a model with rotary positions, "
                                           "e.g. model.arch=llama, may change it)")


def check_resumable(old: DictConfig, new: DictConfig, path: str) -> list[tuple[str, object, object]]:
    """The differences; raises CheckpointUsageError when a shape-defining key differs."""
    check_positions(old, new, path)
    diff = config_diff(old, new)
    keys = shape_keys(new) if family_of(old.model) is family_of(new.model) else SHAPE_KEYS
    shape = [(k, x, y) for k, x, y in diff if k in keys]
    if shape:
        what = ", ".join(f"{k} {x} -> {y}" for k, x, y in shape)
        raise CheckpointUsageError("checkpoint.resume", f"model shape differs from the checkpoint {path}: {what} "
                                                   "(use checkpoint.resume=none or another run.dir to start fresh)")
    return diff


def describe_change(key: str, before, after) -> str:
    """`BEFORE -> AFTER`; a mixture's sources by name: weights changed, sources added or dropped."""
    if key == "data.sources" and isinstance(before, list) and isinstance(after, list) and before and after:
        return mixture_change(before, after)
    return f"{before} -> {after}"


def mixture_change(before: list[dict], after: list[dict]) -> str:
    """`web weight 0.7 -> 0.5, + math (new, weight 0.2)`, and where the stream goes on from."""
    from llmtrain.data.mixture_config import source_names

    old = dict(zip(source_names(before), before))
    new = dict(zip(source_names(after), after))
    parts = []
    for name, source in old.items():
        if name not in new:
            parts.append(f"- {name} (dropped, was weight {source.get('weight')})")
            continue
        if source.get("weight") != new[name].get("weight"):
            parts.append(f"{name} weight {source.get('weight')} -> {new[name].get('weight')}")
        if source.get("path") != new[name].get("path"):
            parts.append(f"{name} path {source.get('path')} -> {new[name].get('path')}")
    parts += [f"+ {name} (new, weight {source.get('weight')})" for name, source in new.items() if name not in old]
    what = ", ".join(parts) or "the same sources in another order"
    return f"{what}; the stream continues from the samples each source has consumed"


def context_change(old: DictConfig, new: DictConfig) -> str | None:
    """One line for a resume at another context length or with other rotary settings (model.seq_len,
    model.rope_*): what changed, that the weights load as saved, and where the data goes on; None when neither
    changed. Rotary positions have no weights, so only a position table (check_positions) fixes the length."""
    before, after = to_plain(old.model), to_plain(new.model)
    keys = [LENGTH_KEY] + [f"model.{k}" for k in sorted(set(before) | set(after)) if k.startswith("rope_")]
    changes = [f"{k} {_short(before.get(k[6:]))} -> {_short(after.get(k[6:]))}" for k in keys
               if before.get(k[6:]) != after.get(k[6:])]
    if not changes:
        return None
    a, b = int(before["seq_len"]), int(after["seq_len"])
    kind = "context extension" if b > a else "shorter context" if b < a else "rotary settings changed"
    data = "the data goes on from the checkpoint's sample count" + (f", in windows of {b} tokens cut anew"
                                                                     if a != b else "")
    return (f"{kind}: {', '.join(changes)}; the weights load as saved; {data} "
            "(docs/models.md#long-context-training)")


def _short(value) -> str:
    """A rope_scaling section as `{factor: 8.0, ...}`, anything else as str()."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {v}" for k, v in value.items()) + "}"
    return str(value)
