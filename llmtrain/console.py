"""The one rich Console and table style every llmtrain command prints with.

Off a terminal (Slurm logs, `llmtrain plan > plan.txt`, CI) rich would assume 80 columns, cut table cells
with "…" and re-wrap long log lines and tracebacks. Here output that is not a terminal gets a very wide width
and soft wrap, so lines are written as they are and tables are as wide as their content; rules keep a
normal width there. In a terminal, tables fit its width and their cells fold rather than being ellipsized.

Messages (`llmtrain: ...`, `llmtrain: error: ...`) go through say/plain: plain text, never read as markup, never
highlighted, never wrapped, so a path or a `[key]` prints as it is and a test can compare the line exactly.
"""

from __future__ import annotations

import sys
from typing import IO

from rich.console import Console
from rich.rule import Rule
from rich.table import Table

from llmtrain.errors import LlmtrainError

FILE_WIDTH = 10_000
RULE_WIDTH = 80


class _Console(Console):
    def __init__(self, file: IO[str] | None = None, **kwargs):
        super().__init__(file=file, **kwargs)
        if not self.is_terminal and "width" not in kwargs:
            self.width = FILE_WIDTH
            self.soft_wrap = True

    def rule(self, *args, **kwargs) -> None:
        if self.is_terminal:
            super().rule(*args, **kwargs)
        else:
            self.print(Rule(*args, **kwargs), width=RULE_WIDTH)


def get_console(file: IO[str] | None = None, **kwargs) -> Console:
    """A Console on `file` (stdout by default); kwargs go to rich's Console."""
    return _Console(file=file, **kwargs)


class _FoldTable(Table):
    def add_column(self, *args, overflow="fold", **kwargs) -> None:
        super().add_column(*args, overflow=overflow, **kwargs)


def fold_table(title: str | None = None, **kwargs) -> Table:
    """A left-titled Table whose cells wrap (folding long words such as paths) instead of ending in "…"."""
    kwargs.setdefault("title_justify", "left")
    return _FoldTable(title=title, **kwargs)


def plain(text: str, *, err: bool = False, console: Console | None = None) -> None:
    """`text` as it is, on `console` (default: stdout, or stderr with err=True): no markup, no highlighting, no
    emoji codes, never wrapped."""
    out = console or get_console(file=sys.stderr if err else None)
    out.print(text, markup=False, highlight=False, emoji=False, soft_wrap=True)


def say(message: str, *, err: bool = False, console: Console | None = None) -> None:
    """`llmtrain: message` as plain text (see plain)."""
    plain(f"llmtrain: {message}", err=err, console=console)


def error_line(err: BaseException | str) -> str:
    """The one line a command reports an error with: `llmtrain: error: KEY: message`."""
    return f"llmtrain: error: {err}"


def fail(err: LlmtrainError, *, console: Console | None = None) -> int:
    """Report `err` on stderr (or `console`) in one line and return the exit code it carries."""
    plain(error_line(err), err=True, console=console)
    return err.exit_code
