"""What `llmtrain data prepare` was asked to do, and what reading one input produced: the values passed between the
command line, the inputs' readers and the preparation that writes the token files (picklable, for worker processes)."""

from __future__ import annotations

from dataclasses import dataclass, field

from .errors import DataError
from .text_input import check_encoding


@dataclass(frozen=True)
class PrepareOptions:
    tokenizer: str | None = None  # a tokenizer.json; None = one token per byte
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    text_key: str = "text"  # the field of a .jsonl line (or column of a table) that holds the document
    encoding: str = "utf-8"  # of text files and jsonl lines; written as UTF-8
    on_bad_line: str = "stop"  # or "skip": a malformed jsonl line / table row
    separator: int | None = None  # byte-level: a byte written after every document; None = none
    eot_token: str | None = None  # --tokenizer: the token after every document; None = look it up, "none" = none
    workers: int = 1
    shard_tokens: int | None = None  # None = one token file

    def __post_init__(self):
        # Checked before anything is read, so a typo never leaves half a preparation behind.
        check_encoding(self.encoding)
        if self.on_bad_line not in ("stop", "skip"):
            raise DataError("--on-bad-line", f"must be stop or skip, got {self.on_bad_line!r}")
        if self.separator is not None and not (isinstance(self.separator, int) and 0 <= self.separator <= 255):
            raise DataError("--separator", f"must be a byte value 0-255, got {self.separator!r}")
        if self.separator is not None and self.tokenizer is not None:
            raise DataError("--separator", "is for byte-level output; with --tokenizer, use --eot-token")
        if self.eot_token is not None and self.tokenizer is None:
            raise DataError("--eot-token", "needs --tokenizer; byte-level output uses --separator")


@dataclass(frozen=True)
class InputUnit:
    """One piece of input read as a whole by one worker."""

    path: str  # what is opened
    name: str  # how messages name it (the path as the user gave it)
    format: str = "text"  # how it is read: formats.input_format's answer


@dataclass
class InputStats:
    tokens: int = 0
    documents: int = 0
    bad_lines: int = 0
    bad_examples: list[str] = field(default_factory=list)  # "FILE:LINE: the parser's message", the first few
