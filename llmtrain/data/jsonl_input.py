"""JSON Lines input of `llmtrain data prepare`: one document per line, the --text-key field of a JSON object, read
from `.jsonl` or, decompressed while streaming, `.jsonl.gz` / `.json.gz` (gzip) and `.jsonl.zst` (zstandard)."""

from __future__ import annotations

import gzip
import io
import json
import zlib
from typing import BinaryIO, Iterator

from .bad_lines import BadLines
from .errors import DataError
from .text_input import NotText, decode_line, is_compressed

TEXT_KEY_FLAG = "--text-key"


def open_decompressed(src: BinaryIO, compression: str | None, name: str) -> BinaryIO:
    """`src` as the stream of its decompressed bytes (itself when `compression` is None)."""
    if compression is None:
        return src
    if compression == "gzip":
        return gzip.GzipFile(fileobj=src, mode="rb")
    if compression == "zstd":
        try:
            import zstandard  # optional dependency, only for .zst input
        except ImportError:
            raise DataError("--input", f"{name}: reading .zst needs the 'zstandard' package: pip install zstandard "
                                       "(or llmtrain[zstd])") from None
        return io.BufferedReader(_ZstdFrames(src, zstandard), buffer_size=1 << 20)
    raise ValueError(f"unknown compression {compression!r}")


# Compressed bytes decompressed at once: small, as one call's output is not bounded otherwise.
_ZSTD_READ = 1 << 16


class _ZstdFrames(io.RawIOBase):
    """The decompressed bytes of every zstd frame of `src` in turn. A stream cut inside a frame raises EOFError
    (zstandard's stream_reader ends quietly there, losing the frame's data without a word)."""

    def __init__(self, src: BinaryIO, zstandard):
        self.src, self.zstandard = src, zstandard
        self.frame = None  # the decompressor of the current frame; None between frames
        self.pending, self.offset = b"", 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while self.offset == len(self.pending):
            data = b""
            if self.frame is not None and self.frame.eof:
                data, self.frame = self.frame.unused_data, None
            data = data or self.src.read(_ZSTD_READ)
            if not data:
                if self.frame is not None:
                    raise EOFError("the stream ends inside a frame")
                return 0
            if self.frame is None:
                self.frame = self.zstandard.ZstdDecompressor().decompressobj()
            try:
                self.pending, self.offset = self.frame.decompress(data), 0
            except self.zstandard.ZstdError as e:
                raise OSError(str(e)) from None
        n = min(len(buffer), len(self.pending) - self.offset)
        buffer[:n] = memoryview(self.pending)[self.offset:self.offset + n]
        self.offset += n
        return n


def jsonl_documents(src: BinaryIO, name: str, key: str, bad: BadLines, encoding: str = "utf-8",
                    compression: str | None = None) -> Iterator[str]:
    """The `key` string of each line's JSON object (blank lines skipped). Raises NotText for a file that is not
    text; a malformed line (not JSON, not an object, no `key`, a value that is not a string) goes to `bad`."""
    lines = open_decompressed(src, compression, name)
    try:
        for lineno, raw in enumerate(lines, 1):
            if lineno == 1 and is_compressed(raw):
                raise NotText("compressed")
            line = decode_line(raw, encoding)
            if not line.strip():
                continue
            text = _line_text(line, key, f"{name}:{lineno}", bad)
            if text is not None:
                yield text
    except (OSError, EOFError, zlib.error) as e:  # a corrupt or truncated gzip/zstd stream
        if compression is None:
            raise
        raise DataError("--input", f"cannot read {name}: not a valid {compression} stream: {e}") from None


def _line_text(line: str, key: str, where: str, bad: BadLines) -> str | None:
    try:
        obj = json.loads(line)
    except ValueError as e:
        return bad.found("--input", where, f"not valid JSON: {_json_error(e)}")
    if not isinstance(obj, dict):
        return bad.found("--input", where, f"expected a JSON object, got {type(obj).__name__}")
    if key not in obj:
        fields = ", ".join(map(repr, list(obj)[:5])) or "no fields"
        return bad.found(TEXT_KEY_FLAG, where, f"no {key!r} field; the line has {fields}")
    text = obj[key]
    if not isinstance(text, str):
        what = "null" if text is None else type(text).__name__
        return bad.found(TEXT_KEY_FLAG, where, f"field {key!r} is {what}, not a string")
    return text


def _json_error(e: ValueError) -> str:
    """The parser's whole message, its position as the column of the line (the line is in FILE:LINE)."""
    if isinstance(e, json.JSONDecodeError):
        return f"{e.msg.removesuffix(' at')} at column {e.colno}"
    return str(e)
