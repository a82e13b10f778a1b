"""What validation refuses, as (key, message), after checking it is one line."""

from __future__ import annotations

import pytest

from llmtrain.config import ConfigError, compose_config
from llmtrain.config.validate import validate


def validate_refusal(*overrides: str) -> tuple[str, str]:
    with pytest.raises(ConfigError) as e:
        validate(compose_config(list(overrides)))
    assert "\n" not in str(e.value)
    return e.value.key, e.value.message
