"""Reading one input of `llmtrain data prepare` into documents and tokens. A text file (plain, .txt.gz or .txt.zst)
is one document; a jsonl line (plain, gzip or zstd), a parquet row or a row of a `datasets` arrow file is one. Input that is not text
(compressed or binary) raises NotText, and `tokenize_input` leaves nothing of it in the output."""

from __future__ import annotations

from typing import BinaryIO, Iterable, Iterator

from .bad_lines import BadLines
from .errors import DataError
from .compressed_input import open_decompressed
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
            stats.tokens = encoder.write_documents(_counted(docs, stats), out)
            return stats
        with _open(unit) as raw, open_decompressed(raw, COMPRESSION[unit.format], unit.name) as src:
            if unit.format in TEXT_FORMATS:
                stats.tokens = encoder.write_file(text_chunks(src, options.encoding), out)
                stats.documents = 1
            else:
                docs = jsonl_documents(src, unit.name, options.text_key, bad, options.encoding)
                stats.tokens = encoder.write_documents(_counted(docs, stats), out)
    except NotText:
        out.seek(start)
        out.truncate()  # drop what was written before the input turned out not to be text
        raise
    return stats


def _open(unit: InputUnit) -> BinaryIO:
    try:
        return open(unit.path, "rb")
    except OSError as e:
        raise DataError("--input", f"cannot read {unit.name}: {e.strerror or e}") from None


def _counted(docs: Iterable[str], stats: InputStats) -> Iterator[str]:
    for doc in docs:
        stats.documents += 1
        yield doc
