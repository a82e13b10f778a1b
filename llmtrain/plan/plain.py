"""A composed config as plain attribute namespaces, for planning many layouts of one config.

Reading a key of an OmegaConf config costs microseconds (node lookup, interpolation checks); a plan reads
thousands, and `plan --suggest` plans thousands of layouts. The planner reads a config only by attribute, `get` and
`copy`, so a resolved plain copy plans the same numbers much faster. Only the planner's arithmetic uses it: a
layout is checked by config.validate on the composed config (plan/search.py).
"""

from __future__ import annotations

from types import SimpleNamespace

from omegaconf import OmegaConf


class Plain(SimpleNamespace):
    """One config section: its keys as attributes; `get`, `[]` and `copy` as a DictConfig has them."""

    def get(self, key: str, default=None):
        return getattr(self, key, default)

    def __getitem__(self, key: str):
        return getattr(self, key)

    def __setitem__(self, key: str, value) -> None:
        setattr(self, key, value)

    def copy(self) -> "Plain":
        """Copies of the sections (one level down): a layout changes keys of sections, never deeper."""
        return Plain(**{k: Plain(**vars(v)) if isinstance(v, Plain) else v for k, v in vars(self).items()})


def _plain(value):
    if isinstance(value, dict):
        return Plain(**{k: _plain(v) for k, v in value.items()})
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def plain(cfg) -> Plain:
    """A resolved plain copy of a composed config."""
    return _plain(OmegaConf.to_container(cfg, resolve=True))


def thawed_dict(value):
    """A Plain back as nested dicts (for hashing a section's values)."""
    if isinstance(value, Plain):
        return {k: thawed_dict(v) for k, v in vars(value).items()}
    if isinstance(value, list):
        return [thawed_dict(v) for v in value]
    return value
