"""What `llmtrain data prepare` was asked to do, and what reading one input produced: the values passed between the
command line, the inputs' readers and the preparation that writes the token files (picklable, for worker processes)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class PrepareOptions:
    tokenizer: str | None = None  # a tokenizer.json; None = one token per byte
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    text_key: str = "text"  # the field of a .jsonl line (or column of a table) that holds the document
    encoding: str = "utf-8"
    on_bad_line: str = "stop"  # or "skip": a malformed jsonl line / table row
    separator: int | None = None  # byte-level: a byte written after every document; None = none
    workers: int = 1
    shard_tokens: int | None = None  # None = one token file


@dataclass(frozen=True)
class InputUnit:
    """One piece of input read as a whole by one worker."""

    path: str  # what is opened
    name: str  # how messages name it (the path as the user gave it)


@dataclass
class InputStats:
    tokens: int = 0
    documents: int = 0
    bad_lines: int = 0
    bad_examples: list[str] = field(default_factory=list)  # "FILE:LINE: the parser's message", the first few
