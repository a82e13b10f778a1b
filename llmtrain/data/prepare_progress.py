"""The live progress bar of `llmtrain data prepare` on a terminal (rich, on stderr): files done/total, MB read,
tokens, MB/s and the time left. Off a terminal it shows nothing; the command prints a summary line instead."""

from __future__ import annotations

import sys


class PrepareProgress:
    def __init__(self, files: int, total_bytes: int, enabled: bool):
        self.files = files
        self.total_bytes = total_bytes
        self.enabled = enabled
        self._bar = None
        self._done_files = self._tokens = 0

    def __enter__(self) -> "PrepareProgress":
        if not self.enabled:
            return self
        from rich.console import Console
        from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn,
                                   TransferSpeedColumn)

        self._bar = Progress(
            TextColumn("[bold]tokenizing"),
            BarColumn(),
            TextColumn("{task.fields[files]} files"),
            DownloadColumn(binary_units=False),
            TextColumn("{task.fields[tokens]} tokens"),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
            console=Console(file=sys.stderr),
            transient=True,  # the summary line replaces it
        )
        self._bar.start()
        self._task = self._bar.add_task("prepare", total=max(self.total_bytes, 1), files=self._files_text(),
                                        tokens="0")
        return self

    def advance(self, nbytes: int, tokens: int, files: int = 1) -> None:
        """`nbytes` more of the input read, `tokens` written and `files` done (0 for a chunk before a file's last)."""
        self._done_files += files
        self._tokens += tokens
        if self._bar is not None:
            self._bar.update(self._task, advance=nbytes, files=self._files_text(), tokens=f"{self._tokens:,}")

    def _files_text(self) -> str:
        return f"{self._done_files}/{self.files}"

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
