"""data=mix before launch: each source passes the checks of a data=memmap file, and the mixture as a whole has
usable weights, distinct names and one tokenizer. Each failure is one line naming the source and its key. Sources
are read with os + json only (sizes, meta files, index.json): no torch, the launcher starts fast."""

from __future__ import annotations

import dataclasses
import json
import math
import os

from omegaconf import DictConfig, OmegaConf

from llmtrain.config.errors import ConfigError
from llmtrain.data.errors import DataError
from llmtrain.data.mixture_config import source_names
from llmtrain.data.token_source import TokenSource, index_path, inspect_token_source
from llmtrain.data.tokenfile import check_split_sizes, check_vocab, read_token_meta

EXAMPLE = "data.sources='[{path: web/, weight: 0.7}, {path: code.bin, weight: 0.3}]'"


@dataclasses.dataclass(frozen=True)
class MixtureSource:
    """One checked source: its name, its path as configured, its share of the samples and its facts."""

    name: str
    path: str
    weight: float  # as configured
    share: float  # weight / the sum of the weights
    facts: TokenSource
    tokenizer: str | None  # "byte", a tokenizer.json path, or None when the source has no meta saying


def _key(i: int, field: str = "path") -> str:
    return f"data.sources[{i}].{field}"


def check_mixture(cfg: DictConfig) -> list[MixtureSource]:
    """Every data=mix rule; ConfigError for the first one broken, else the checked sources in config order."""
    d, t = cfg.data, cfg.train
    if d.path is not None:
        raise ConfigError("data.path", f"is not used by data=mix (its files are data.sources); remove it "
                                       f"(data.path=null) and list the sources: {EXAMPLE}")
    if OmegaConf.is_missing(d, "sources") or not d.sources:
        raise ConfigError("data.sources", f"data=mix needs at least one source (a token file or a folder of "
                                          f"shards, each with a weight): {EXAMPLE}")
    for i, source in enumerate(d.sources):
        if OmegaConf.is_missing(source, "path") or not source.path:
            raise ConfigError(_key(i), "every source needs a path (a token file or a folder of shards)")
    shares = _shares(d.sources)
    names = _distinct_names(d.sources)
    need_val = bool(t.eval_interval and t.eval_steps)  # the trainer evaluates only then
    checked = []
    for i, (source, name, share) in enumerate(zip(d.sources, names, shares)):
        facts = _checked_source(i, name, str(source.path), cfg, need_val)
        checked.append(MixtureSource(name, str(source.path), float(source.weight), share, facts, _tokenizer(facts)))
    _one_tokenizer(checked)
    return checked


def _shares(sources) -> list[float]:
    weights = []
    for i, source in enumerate(sources):
        w = source.weight
        if not (isinstance(w, (int, float)) and math.isfinite(w) and w >= 0):
            raise ConfigError(_key(i, "weight"), f"must be a finite number >= 0 (got {w})")
        weights.append(float(w))
    total = sum(weights)
    if total <= 0:
        raise ConfigError("data.sources", "the weights sum to 0: give at least one source a weight > 0")
    return [w / total for w in weights]


def _distinct_names(sources) -> list[str]:
    names = source_names(sources)
    first: dict[str, int] = {}
    for i, name in enumerate(names):
        if name not in first:
            first[name] = i
            continue
        j = first[name]
        if sources[i].get("name"):
            raise ConfigError(_key(i, "name"), f"source name {name} is also the name of data.sources[{j}]; names "
                                               "must be distinct (metrics and resume checks go by name)")
        raise ConfigError(_key(i), f"{sources[i].path} and data.sources[{j}].path {sources[j].path} are both "
                                   f"named {name} (a source without a name is named after its file or folder); "
                                   f"give them distinct names: {{path: ..., weight: ..., name: ...}}")
    return names


def _checked_source(i: int, name: str, path: str, cfg: DictConfig, need_val: bool) -> TokenSource:
    """check_token_source's checks, with the source's name and its configured path in each message."""
    key, label = _key(i), f"source {name} ({path})"
    try:
        facts = inspect_token_source(path, cfg.data.dtype, key)
        check_vocab(dataclasses.replace(facts, path=label), cfg.model.vocab_size)
        check_split_sizes(label, facts.num_tokens, cfg.model.seq_len, cfg.data.val_fraction, need_val, key=key,
                          more="use more data for this source")
    except DataError as e:
        if e.key == key and not e.message.startswith(label):
            raise ConfigError(key, f"source {name}: {e.message}") from None
        raise ConfigError(e.key, e.message if label in e.message else f"{e.message} (source {name}, {key})") \
            from None
    return facts


def _tokenizer(facts: TokenSource) -> str | None:
    """The tokenizer a source's meta (a file's FILE.json, a folder's index.json) says it was prepared with."""
    try:
        if os.path.isdir(facts.path):
            with open(index_path(facts.path), encoding="utf-8") as f:
                meta = json.load(f)
        else:
            meta = read_token_meta(facts.path) or {}
    except (OSError, ValueError, DataError):  # already read once by the inspection: unreadable is not expected
        return None
    value = meta.get("tokenizer") if isinstance(meta, dict) else None
    return str(value) if value else None


def _same_tokenizer(a: str, b: str) -> bool:
    if a == b:
        return True
    try:  # two copies of one tokenizer.json are the same tokenizer
        with open(a, "rb") as fa, open(b, "rb") as fb:
            return fa.read() == fb.read()
    except OSError:
        return False


def _describe(tokenizer: str) -> str:
    return "byte-level tokens" if tokenizer == "byte" else f"the tokenizer {tokenizer}"


def _one_tokenizer(sources: list[MixtureSource]) -> None:
    known = [(i, s) for i, s in enumerate(sources) if s.tokenizer is not None]
    for i, source in known[1:]:
        _, first = known[0]
        if not _same_tokenizer(first.tokenizer, source.tokenizer):
            raise ConfigError(_key(i), f"source {source.name} was prepared with {_describe(source.tokenizer)} and "
                                       f"source {first.name} with {_describe(first.tokenizer)}; the sources of a "
                                       "mixture must share one tokenizer (an id must mean the same text in each): "
                                       f"prepare {source.name} again with {first.name}'s tokenizer")
