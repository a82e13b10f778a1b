"""The dotted keys the schema defines (`model.n_layers`, `checkpoint.async`), read from its dataclasses: which keys
exist, which are free maps (`env`, `network.env`) whose own keys a user chooses, and the key closest to a typo."""

from __future__ import annotations

import dataclasses
import difflib
import re
import typing
from functools import lru_cache

from llmtrain.config.schema import LLMTrainConfig

SECTION, FIELD, FREE_MAP, MAP_ENTRY, UNKNOWN = "section", "field", "free map", "map entry", "unknown"


def _user_names(cls: type) -> dict[str, str]:
    """{the name users write: the dataclass field} of one section (checkpoint.async is the field async_save)."""
    from llmtrain.config.compose import _KEYWORD_KEYS

    names = {f.name: f.name for f in dataclasses.fields(cls)}
    for (_section, key), field_name in _KEYWORD_KEYS.items():
        if field_name in names:
            names[key] = names.pop(field_name)
    return names


def _is_map(tp) -> bool:
    return typing.get_origin(tp) in (dict, typing.Dict)


def key_kind(key: str) -> str:
    """SECTION (a dataclass: `model`), FIELD (`model.n_layers`), FREE_MAP (`env`), MAP_ENTRY (a key inside a free
    map: `network.env.NCCL_IB_HCA`) or UNKNOWN."""
    cls: typing.Any = LLMTrainConfig
    parts = key.split(".")
    for i, part in enumerate(parts):
        if not dataclasses.is_dataclass(cls):
            return MAP_ENTRY if _is_map(cls) else UNKNOWN
        name = _user_names(cls).get(part)
        if name is None:
            return UNKNOWN
        cls = typing.get_type_hints(cls)[name]
    if dataclasses.is_dataclass(cls):
        return SECTION
    return FREE_MAP if _is_map(cls) else FIELD


@lru_cache(maxsize=1)
def schema_keys() -> tuple[str, ...]:
    """Every dotted key of a field or free map the schema defines."""
    keys, todo = [], [("", LLMTrainConfig)]
    while todo:
        prefix, cls = todo.pop()
        hints = typing.get_type_hints(cls)
        for user, name in _user_names(cls).items():
            if dataclasses.is_dataclass(hints[name]):
                todo.append((f"{prefix}{user}.", hints[name]))
            else:
                keys.append(f"{prefix}{user}")
    return tuple(sorted(keys))


def _element_fields(list_key: str) -> list[str]:
    """The fields of the dataclass a list key holds (data.sources: path, weight, name); [] for other keys."""
    cls: typing.Any = LLMTrainConfig
    for part in list_key.split("."):
        if not dataclasses.is_dataclass(cls) or part not in _user_names(cls):
            return []
        cls = typing.get_type_hints(cls)[_user_names(cls)[part]]
    args = typing.get_args(cls) if typing.get_origin(cls) in (list, typing.List) else ()
    return [f.name for f in dataclasses.fields(args[0])] if args and dataclasses.is_dataclass(args[0]) else []


def closest_key(key: str) -> str | None:
    """The schema key a misspelt `key` most likely meant (model.n_layer -> model.n_layers,
    data.sources[0].wieght -> data.sources[0].weight), or None."""
    element = re.fullmatch(r"(.+)(\[\d*\])\.([^.]+)", key)
    if element:
        close = difflib.get_close_matches(element[3], _element_fields(element[1]), n=1, cutoff=0.6)
        return f"{element[1]}{element[2]}.{close[0]}" if close else None
    sections = {k.rsplit(".", 1)[0] for k in schema_keys() if "." in k}
    close = difflib.get_close_matches(key, [*schema_keys(), *sections], n=1, cutoff=0.8)
    return close[0] if close else None
