"""One error type for every bad input: it names the key (or file/flag) and the rule, and prints on one line.
It lives in llmtrain.errors with the other errors and their exit codes; imported from here as well."""

from llmtrain.errors import ConfigError

__all__ = ["ConfigError"]
