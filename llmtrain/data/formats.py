"""Which format an input file is read as, from its name: `llmtrain data prepare`'s table of formats."""

from __future__ import annotations

# Name endings, longest first; anything else is read as text (one document per file). Other compressed files
# (.gz, .zip, .tar.gz, ...) are text to this table, and text_input.py skips them by their magic bytes.
_SUFFIXES = (
    (".jsonl.gz", "jsonl.gz"),
    (".json.gz", "jsonl.gz"),  # the jsonl inside gzip that many corpora ship as .json.gz
    (".jsonl.zst", "jsonl.zst"),
    (".jsonl", "jsonl"),
    (".txt.gz", "text.gz"),
    (".txt.zst", "text.zst"),
    (".parquet", "parquet"),
    (".arrow", "arrow"),
)
# The stream each streamed format is decompressed with (None: read as is).
COMPRESSION = {"text": None, "text.gz": "gzip", "text.zst": "zstd", "jsonl": None, "jsonl.gz": "gzip",
               "jsonl.zst": "zstd"}
TEXT_FORMATS = ("text", "text.gz", "text.zst")  # one document per file
TABLE_FORMATS = ("parquet", "arrow")


def input_format(path: str) -> str:
    lower = path.lower()
    for suffix, fmt in _SUFFIXES:
        if lower.endswith(suffix):
            return fmt
    return "text"
