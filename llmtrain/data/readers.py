"""Reading one input of `llmtrain data prepare` into documents: a text file is one document, a `.jsonl` file one
per line. Input that is not text (compressed or binary) raises NotText, and `tokenize_input` leaves nothing of it in
the output."""

from __future__ import annotations

import codecs
import json
import re
from typing import BinaryIO, Iterator

from .errors import DataError
from .prepare_options import InputStats, InputUnit, PrepareOptions

# Read size for streaming byte-level input: bounds memory on multi-GB corpora.
READ_CHUNK = 1 << 24
# Leading bytes of compressed files: tokenizing them would train on noise.
_COMPRESSED_MAGIC = (b"\x1f\x8b", b"PK\x03\x04", b"PK\x05\x06", b"PK\x07\x08", b"\xfd7zXZ\x00", b"\x28\xb5\x2f\xfd")
_BZIP2_MAGIC = re.compile(rb"BZh[1-9](1AY&SY|\x17rE8P\x90)")  # header + first block (or end-of-stream) magic


class NotText(Exception):
    """The file being read is not text; `reason` is "binary" or "compressed"."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def _is_compressed(head: bytes) -> bool:
    return head.startswith(_COMPRESSED_MAGIC) or _BZIP2_MAGIC.match(head) is not None


def text_chunks(src: BinaryIO) -> Iterator[bytes]:
    """The file's bytes in bounded chunks, each checked before it is yielded: raises NotText at
    compressed magic bytes, a NUL byte or invalid UTF-8 (an incomplete final sequence included)."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    first = True
    while chunk := src.read(READ_CHUNK):
        if first and _is_compressed(chunk):
            raise NotText("compressed")
        first = False
        if b"\x00" in chunk:
            raise NotText("binary")
        # Pure ASCII needs no decoding (unless a multi-byte character straddles the chunk boundary).
        if not (chunk.isascii() and not decoder.getstate()[0]):
            try:
                decoder.decode(chunk)
            except UnicodeDecodeError:
                raise NotText("binary") from None
        yield chunk
    try:
        decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        raise NotText("binary") from None


def jsonl_documents(src: BinaryIO, name: str, key: str) -> Iterator[str]:
    """The `key` string of each line's JSON object (blank lines skipped). Raises NotText for a file
    that is not text, and a DataError naming file:line for a line that is not such an object."""
    for lineno, raw in enumerate(src, 1):
        if lineno == 1 and _is_compressed(raw):
            raise NotText("compressed")
        if b"\x00" in raw:
            raise NotText("binary")
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise NotText("binary") from None
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as e:
            raise DataError("--input", f"{name}:{lineno}: not valid JSON: {_json_error(e)}") from None
        if not isinstance(obj, dict):
            raise DataError("--input", f"{name}:{lineno}: expected a JSON object, got {type(obj).__name__}")
        if key not in obj:
            raise DataError("--jsonl-key", f"{name}:{lineno}: no {key!r} field; the line has "
                                           f"{', '.join(map(repr, list(obj)[:5])) or 'no fields'}")
        text = obj[key]
        if not isinstance(text, str):
            raise DataError("--jsonl-key", f"{name}:{lineno}: field {key!r} is {type(text).__name__}, not a string")
        yield text


def _json_error(e: ValueError) -> str:
    """The parser's whole message, its position as the column of the line (the line is in FILE:LINE)."""
    if isinstance(e, json.JSONDecodeError):
        return f"{e.msg.removesuffix(' at')} at column {e.colno}"
    return str(e)


def utf8(text: str) -> bytes:
    # JSON may escape lone surrogates (\ud800), which UTF-8 cannot encode: they become U+FFFD.
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace")


def tokenize_input(unit: InputUnit, encoder, out: BinaryIO, options: PrepareOptions) -> InputStats:
    """Append the tokens of `unit` to `out`. Raises NotText, having written nothing, when the input is not text, and
    DataError for unreadable input or a malformed line."""
    try:
        src = open(unit.path, "rb")
    except OSError as e:
        raise DataError("--input", f"cannot read {unit.name}: {e.strerror or e}") from None
    start = out.tell()
    stats = InputStats()
    try:
        with src:
            if unit.path.lower().endswith(".jsonl"):
                stats.tokens = encoder.write_documents(jsonl_documents(src, unit.name, options.text_key), out)
            else:
                stats.tokens = encoder.write_file(text_chunks(src), out)
    except NotText:
        out.seek(start)
        out.truncate()  # drop what was written before the input turned out not to be text
        raise
    return stats
