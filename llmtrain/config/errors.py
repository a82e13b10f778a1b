"""One error type for every bad input: it names the key (or file/flag) and the rule, and prints on one line."""


class ConfigError(Exception):
    def __init__(self, key: str, message: str):
        super().__init__(f"{key}: {message}")
        self.key = key
        self.message = message
