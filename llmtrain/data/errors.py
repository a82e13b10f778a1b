"""Errors raised by the data package, each naming the config key or CLI flag to fix."""


class DataError(Exception):
    """A data problem the user can fix; `key` is the config key or flag at fault (e.g. "data.path")."""

    def __init__(self, key: str, message: str):
        super().__init__(f"{key}: {message}")
        self.key = key
        self.message = message

    def __str__(self) -> str:
        return f"{self.key}: {self.message}"
