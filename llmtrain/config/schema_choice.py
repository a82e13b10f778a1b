"""choice(): a schema field with a fixed set of values (OmegaConf 2.3 takes neither Literal nor Enums of values
such as "1f1b"); validate.py checks every such field, and code that needs the set reads it with choices_of()."""

from __future__ import annotations

from dataclasses import field, fields
from typing import Any


def choice(default: Any, *allowed: Any) -> Any:
    """A field whose value must be one of `allowed`; a None default makes None allowed too (an optional field)."""
    return field(default=default, metadata={"choices": allowed + ((None,) if default is None else ())})


def choices_of(section: type, name: str) -> tuple:
    """The allowed values of a choice() field."""
    return next(f.metadata["choices"] for f in fields(section) if f.name == name)
