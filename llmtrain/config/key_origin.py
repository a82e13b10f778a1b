"""Where an unknown key came from: an override, or the YAML file of a config option (which can be one of the
user's --config-dir files), so its error names the file to fix and the schema key it most likely meant."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Sequence

from omegaconf import OmegaConf

from llmtrain.config.errors import ConfigError
from llmtrain.config.schema_keys import closest_key

_PACKAGE = re.compile(r"^#\s*@package\s+(\S+)", re.M)
_ABSENT = object()


def unknown_key_error(key: str, overrides: Sequence[str], choices: dict[str, str | None],
                      config_dirs: Sequence[Path], primary: str) -> ConfigError:
    """`key: unknown key [in FILE] (not in the schema; did you mean KEY?)`. choices: each group's chosen option;
    config_dirs: the search path in order (the user's folders, then the built-in one)."""
    close = closest_key(key)
    hint = f"did you mean {close}?" if close else "check its spelling"
    where = "" if _set_by_override(key, overrides, choices) else _file_holding(key, choices, config_dirs, primary)
    return ConfigError(key, f"unknown key{f' in {where}' if where else ''} (not in the schema; {hint})")


def _set_by_override(key: str, overrides: Sequence[str], choices: dict[str, str | None]) -> bool:
    for override in overrides:
        bare = override.partition("=")[0].lstrip("+~")
        if bare in choices:  # model=mine picks a file; the key is in that file
            continue
        if bare == key or key.startswith((f"{bare}.", f"{bare}[")) or bare.startswith(f"{key}."):
            return True
    return False


def _file_holding(key: str, choices: dict[str, str | None], config_dirs: Sequence[Path], primary: str) -> str:
    """The config file that sets `key`: a chosen option's YAML (the first folder of the search path that has it,
    as Hydra picks it) or the primary config; '' when none does."""
    candidates = [(f"{primary}.yaml", "")]
    candidates += [(f"{group}/{option}.yaml", group.replace("/", ".")) for group, option in choices.items()
                   if option and not group.startswith("hydra")]
    for relative, package in candidates:
        path = next((d / relative for d in config_dirs if (d / relative).is_file()), None)
        if path is not None and _holds(path, package, key):
            return str(path)
    return ""


def _holds(path: Path, package: str, key: str) -> bool:
    try:
        text = path.read_text()
        node = OmegaConf.create(OmegaConf.load(path))
    except Exception:  # an unreadable file is reported by the composition itself
        return False
    header = _PACKAGE.search(text)
    if header:
        package = {"_global_": "", "_group_": package}.get(header.group(1), header.group(1))
    if package and not (key == package or key.startswith(f"{package}.")):
        return False
    relative = key[len(package) + 1:] if package else key
    return bool(relative) and OmegaConf.select(node, relative, default=_ABSENT) is not _ABSENT
