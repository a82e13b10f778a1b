"""Overrides Hydra would take in a way the user did not mean, or could not read at all: one line each, naming the
key and what to write instead."""

from __future__ import annotations

import re
from typing import Sequence

from llmtrain.config.errors import ConfigError
from llmtrain.config.schema_keys import FIELD, FREE_MAP, SECTION, key_kind


def check_deletions(overrides: Sequence[str], groups: set[str]) -> None:
    """`~KEY` on a key the schema defines would not remove it: the schema's default comes back in its place (a
    gpt-125m with 4 layers). Only the entries of free maps (`~network.env.NCCL_IB_HCA`) can be deleted."""
    for override in overrides:
        if not override.startswith("~"):
            continue
        key = override[1:].partition("=")[0]
        if key in groups:
            raise ConfigError(key, f"a config group cannot be deleted (~{key} would leave the schema's defaults in "
                                   f"its place); choose an option instead: {key}=OPTION (llmtrain --help lists them)")
        kind = key_kind(key)
        instead = {SECTION: f"set its keys instead: {key}.KEY=VALUE", FIELD: f"set it instead: {key}=VALUE",
                   FREE_MAP: f"add or delete its entries instead: +{key}.NAME=VALUE, ~{key}.NAME"}
        if kind in instead:
            raise ConfigError(key, f"the schema defines this key, so ~{key} would bring back its default, not "
                                   f"delete it; {instead[kind]}")


def quoting_error(override: str, parse_message: str) -> ConfigError:
    """The error for an override Hydra's grammar cannot read. When quoting the value makes it readable (a quote,
    space or one of ()[]{},:= inside it), the line shows that form, checked with Hydra's own parser, and how to
    pass it through a shell."""
    key, eq, value = override.partition("=")
    bare = key.lstrip("+~") or "override"
    meant_a_list = value.lstrip().startswith(("[", "{"))  # `[1,2` is a list with a typo, not a string to quote
    quoted = _quoted(value) if eq and not meant_a_list else None
    if quoted is not None and _parses_to(f"{key}={quoted}", value):
        form = f"{key}={quoted}"
        return ConfigError(bare, f"Hydra's override grammar cannot read the value {value} unquoted; quote it: "
                                 f"{form} (in a shell: {shell_word(form)})")
    return ConfigError(bare, f"Hydra's override grammar cannot read {override!r}: {parse_message}")


def _quoted(value: str) -> str:
    """`value` as a quoted Hydra string: in double quotes, or in single quotes when it holds a double quote."""
    if '"' not in value:
        return f'"{value}"'
    if "'" not in value:
        return f"'{value}'"
    return '"' + value.replace('"', '\\"') + '"'


def _parses_to(override: str, value: str) -> bool:
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        return OverridesParser.create().parse_override(override).value() == value
    except HydraException:
        return False


def shell_word(text: str) -> str:
    """`text` as one word for a POSIX shell: in single quotes, or in double quotes when it holds a single quote."""
    if "'" not in text:
        return f"'{text}'"
    return '"' + re.sub(r'([\\"$`])', r"\\\1", text) + '"'
