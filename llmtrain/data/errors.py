"""Errors raised by the data package, each naming the config key or CLI flag to fix. They live in
llmtrain.errors with the other errors and their exit codes; imported from here as well."""

from llmtrain.errors import DataError

__all__ = ["DataError"]
