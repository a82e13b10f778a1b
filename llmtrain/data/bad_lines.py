"""--on-bad-line: what a malformed jsonl line or table row does, stop the preparation (the default) or be skipped
and counted."""

from __future__ import annotations

from .errors import DataError
from .prepare_options import InputStats

# Skipped lines named in full per input; the rest are only counted.
BAD_EXAMPLES = 3


class BadLines:
    """Applies --on-bad-line to one input, recording skipped lines in `stats`."""

    def __init__(self, policy: str, stats: InputStats):  # policy: "stop" or "skip" (PrepareOptions checks)
        self.policy = policy
        self.stats = stats

    def found(self, key: str, where: str, message: str) -> None:
        """A malformed line at `where` (FILE:LINE): raises a DataError naming `key`, or counts it."""
        if self.policy == "stop":
            raise DataError(key, f"{where}: {message}")
        self.stats.bad_lines += 1
        if len(self.stats.bad_examples) < BAD_EXAMPLES:
            self.stats.bad_examples.append(f"{where}: {message}")
