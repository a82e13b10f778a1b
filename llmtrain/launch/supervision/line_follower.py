"""Following files that other processes write: logs and metrics that grow while a job runs."""

from __future__ import annotations

import os


class LineFollower:
    """Yields the complete new lines of a file that may not exist yet and keeps growing."""

    def __init__(self, path: str, from_end: bool = False):
        """from_end: skip what the file already holds (a rank log appended to by an earlier launch)."""
        self.path = path
        self.offset = os.path.getsize(path) if from_end and os.path.exists(path) else 0
        self.partial = ""

    def new_lines(self) -> list[str]:
        try:
            with open(self.path, "r", errors="replace") as f:
                f.seek(self.offset)
                data = f.read()
                self.offset = f.tell()
        except FileNotFoundError:
            return []
        data = self.partial + data
        lines = data.split("\n")
        self.partial = lines.pop()
        return lines
