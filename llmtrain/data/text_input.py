"""Plain text input of `llmtrain data prepare`: the checks that tell text from binary or compressed bytes, and a
file's text as UTF-8 chunks whatever --encoding it is stored in."""

from __future__ import annotations

import codecs
import re
from typing import BinaryIO, Iterator

from .errors import DataError

# Read size for streaming input: bounds memory on multi-GB corpora.
READ_CHUNK = 1 << 24
# Leading bytes of compressed files: tokenizing them would train on noise.
_COMPRESSED_MAGIC = (b"\x1f\x8b", b"PK\x03\x04", b"PK\x05\x06", b"PK\x07\x08", b"\xfd7zXZ\x00", b"\x28\xb5\x2f\xfd")
_BZIP2_MAGIC = re.compile(rb"BZh[1-9](1AY&SY|\x17rE8P\x90)")  # header + first block (or end-of-stream) magic


class NotText(Exception):
    """The file being read is not text; `reason` is "binary" or "compressed"."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def is_compressed(head: bytes) -> bool:
    return head.startswith(_COMPRESSED_MAGIC) or _BZIP2_MAGIC.match(head) is not None


def is_utf8(encoding: str) -> bool:
    return codecs.lookup(encoding).name == "utf-8"


def check_encoding(encoding: str) -> None:
    """A one-line DataError naming --encoding unless `encoding` is a text encoding Python knows."""
    try:
        info = codecs.lookup(encoding)
    except LookupError:
        raise DataError("--encoding", f"unknown encoding {encoding!r} (e.g. utf-8, latin-1, cp1252)") from None
    if not getattr(info, "_is_text_encoding", True):  # base64, rot13, zlib...: bytes-to-bytes codecs
        raise DataError("--encoding", f"{encoding!r} is not a text encoding")


def utf8(text: str) -> bytes:
    # JSON may escape lone surrogates (\ud800), which UTF-8 cannot encode: they become U+FFFD.
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace")


def text_chunks(src: BinaryIO, encoding: str = "utf-8") -> Iterator[bytes]:
    """The file's text as UTF-8 bytes in bounded chunks, each checked before it is yielded: raises NotText at
    compressed magic bytes, a NUL character or bytes not valid in `encoding` (an incomplete final sequence
    included). UTF-8 input is passed through as is, so its output is the file's bytes exactly."""
    utf8_input = is_utf8(encoding)
    decoder = codecs.getincrementaldecoder(encoding)()
    first = True
    while chunk := src.read(READ_CHUNK):
        if first and is_compressed(chunk):
            raise NotText("compressed")
        first = False
        if utf8_input:
            if b"\x00" in chunk:
                raise NotText("binary")
            # Pure ASCII needs no decoding (unless a multi-byte character straddles the chunk boundary).
            if not (chunk.isascii() and not decoder.getstate()[0]):
                _decode(decoder, chunk)
            yield chunk
        else:
            text = _decode(decoder, chunk)
            if "\x00" in text:  # checked after decoding: UTF-16 text is full of NUL bytes
                raise NotText("binary")
            yield utf8(text)
    tail = _decode(decoder, b"", final=True)
    if tail and not utf8_input:
        yield utf8(tail)


def decode_line(raw: bytes, encoding: str) -> str:
    """One line of text input, checked like text_chunks' chunks."""
    if b"\x00" in raw and is_utf8(encoding):
        raise NotText("binary")
    try:
        line = raw.decode(encoding)
    except UnicodeDecodeError:
        raise NotText("binary") from None
    if "\x00" in line:
        raise NotText("binary")
    return line


def _decode(decoder, data: bytes, final: bool = False) -> str:
    try:
        return decoder.decode(data, final=final)
    except UnicodeDecodeError:
        raise NotText("binary") from None
