"""Reading one input of `llmtrain data prepare` into documents and tokens. A text file (plain, .txt.gz or .txt.zst)
is one document; a jsonl line (plain, gzip or zstd), a parquet row or a row of a `datasets` arrow file is one. Input that is not text
(compressed or binary) raises NotText, and `tokenize_input` leaves nothing of it in the output."""

from __future__ import annotations

import io
from typing import BinaryIO, Iterable, Iterator

from .bad_lines import BadLines
from .errors import DataError
from .compressed_input import open_decompressed, text_bytes_read
from .formats import COMPRESSION, TABLE_FORMATS, TEXT_FORMATS
from .jsonl_input import jsonl_documents
from .prepare_options import InputStats, InputUnit, PrepareOptions
from .table_input import table_documents
from .text_input import READ_CHUNK, NotText, text_chunks, utf8

__all__ = ["READ_CHUNK", "NotText", "text_chunks", "tokenize_input", "utf8"]


def tokenize_input(unit: InputUnit, encoder, out: BinaryIO, options: PrepareOptions) -> InputStats:
    """Append the tokens of `unit` to `out`. Raises NotText, having written nothing, when the input is not text, and
    DataError for unreadable input or (with --on-bad-line stop) a malformed line."""
    stats = InputStats()
    bad = BadLines(options.on_bad_line, stats)
    start = out.tell()
    try:
        if unit.format in TABLE_FORMATS:
            docs = table_documents(unit.path, unit.name, unit.format, options.text_key, bad)
            stats.tokens = encoder.write_documents(_counted(docs, stats, text_bytes=True), out)
            return stats
        if unit.chunk is not None:  # lines the reader cut from a jsonl file (input_chunks.py)
            if unit.chunk.error is not None:
                raise DataError(*unit.chunk.error)
            docs = jsonl_documents(io.BytesIO(unit.chunk.data), unit.name, options.text_key, bad, options.encoding,
                                   first_line=unit.chunk.first_line)
            stats.tokens = encoder.write_documents(_counted(docs, stats), out)
            stats.text_bytes = len(unit.chunk.data)
            return stats
        with open_input(unit) as raw, open_decompressed(raw, COMPRESSION[unit.format], unit.name) as src:
            if unit.format in TEXT_FORMATS:
                stats.tokens = encoder.write_file(text_chunks(src, options.encoding), out)
                stats.documents = 1
            else:
                docs = jsonl_documents(src, unit.name, options.text_key, bad, options.encoding)
                stats.tokens = encoder.write_documents(_counted(docs, stats), out)
            stats.text_bytes = text_bytes_read(src)
    except NotText:
        out.seek(start)
        out.truncate()  # drop what was written before the input turned out not to be text
        raise
    return stats


def open_input(unit: InputUnit) -> BinaryIO:
    try:
        return open(unit.path, "rb")
    except OSError as e:
        raise DataError("--input", f"cannot read {unit.name}: {e.strerror or e}") from None


def _counted(docs: Iterable[str], stats: InputStats, text_bytes: bool = False) -> Iterator[str]:
    """The documents, counted; with `text_bytes`, their UTF-8 bytes too (a table's text, not its file's bytes)."""
    for doc in docs:
        stats.documents += 1
        if text_bytes:
            stats.text_bytes += len(doc) if doc.isascii() else len(utf8(doc))
        yield doc
