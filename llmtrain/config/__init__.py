"""Config composition (Hydra), the typed schema and the validation rules."""

from llmtrain.config.compose import builtin_config_dir, compose_config, load_run_config, to_yaml
from llmtrain.config.errors import ConfigError
from llmtrain.config.validate import validate

__all__ = ["ConfigError", "builtin_config_dir", "compose_config", "load_run_config", "to_yaml", "validate"]
