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
class Chunk:
    """Whole lines of a file's text, cut by the reader that splits it among the workers (input_chunks.py)."""

    data: bytes
    first_line: int  # the number of its first line in the file (for FILE:LINE in messages)
    index: int  # 0, 1, ... in the file
    last: bool  # the file's last chunk
    input_bytes: int  # bytes of the file as stored (compressed) read for it: the progress bar's measure
    error: tuple[str, str] | None = None  # (key, message): reading the file failed here; raised in its turn


@dataclass(frozen=True)
class InputUnit:
    """One piece of input read as a whole by one worker: a file, or a chunk of one."""

    path: str  # what is opened
    name: str  # how messages name it (the path as the user gave it)
    format: str = "text"  # how it is read: formats.input_format's answer
    chunk: Chunk | None = None  # the part of the file to read; None: all of it

    @property
    def first(self) -> bool:
        return self.chunk is None or self.chunk.index == 0

    @property
    def last(self) -> bool:
        return self.chunk is None or self.chunk.last


@dataclass
class InputStats:
    tokens: int = 0
    documents: int = 0
    bad_lines: int = 0
    bad_examples: list[str] = field(default_factory=list)  # "FILE:LINE: the parser's message", the first few
    text_bytes: int = 0  # of text read (decompressed; a table's documents as UTF-8)

    def add(self, other: "InputStats", examples: int) -> None:
        """Count `other` (a later piece of input) in, keeping the first `examples` bad-line examples."""
        self.tokens += other.tokens
        self.documents += other.documents
        self.bad_lines += other.bad_lines
        self.text_bytes += other.text_bytes
        self.bad_examples.extend(other.bad_examples[:max(0, examples - len(self.bad_examples))])
