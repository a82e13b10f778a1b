"""Compressed input of `llmtrain data prepare` decompressed while it is read: gzip (stdlib) and zstd (the optional
`zstandard` package). A corrupt or truncated stream is an error naming the file, never a quietly short document."""

from __future__ import annotations

import gzip
import io
import zlib
from typing import BinaryIO

from .errors import DataError

# What a broken stream raises while it is read (_ZstdFrames turns zstandard's errors into these).
_STREAM_ERRORS = (OSError, EOFError, zlib.error)


def open_decompressed(src: BinaryIO, compression: str | None, name: str) -> BinaryIO:
    """`src` as the stream of its decompressed bytes (itself when `compression` is None); reading it raises a
    DataError naming the file when the stream is corrupt or truncated."""
    if compression is None:
        return src
    if compression == "gzip":
        return io.BufferedReader(_Checked(gzip.GzipFile(fileobj=src, mode="rb"), name, compression), 1 << 20)
    if compression == "zstd":
        try:
            import zstandard  # optional dependency, only for .zst input
        except ImportError:
            raise DataError("--input", f"{name}: reading .zst needs the 'zstandard' package: pip install zstandard "
                                       "(or llmtrain[zstd])") from None
        return io.BufferedReader(_Checked(_ZstdFrames(src, zstandard), name, compression), 1 << 20)
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


def text_bytes_read(src: BinaryIO) -> int:
    """The bytes of text `src` (from open_decompressed) has given: decompressed, read-ahead included (all of them,
    once it is read to its end)."""
    raw = getattr(src, "raw", None)
    return raw.given if isinstance(raw, _Checked) else src.tell()


class _Checked(io.RawIOBase):
    """A decompressing stream whose errors name the file (and only its own: a failing write is not one of them)."""

    def __init__(self, inner, name: str, compression: str):
        self.inner, self.name, self.compression = inner, name, compression
        self.given = 0  # decompressed bytes returned

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        try:
            n = self.inner.readinto(buffer)
            self.given += n or 0
            return n
        except _STREAM_ERRORS as e:
            raise DataError("--input", f"cannot read {self.name}: not a valid {self.compression} stream: {e}") from None
