"""Which format an input file is read as, from its name: `llmtrain data prepare`'s table of formats."""

from __future__ import annotations

# Name endings, longest first; anything else is read as text (one document per file).
_SUFFIXES = (
    (".jsonl.gz", "jsonl.gz"),
    (".json.gz", "jsonl.gz"),  # the jsonl inside gzip that many corpora ship as .json.gz
    (".jsonl.zst", "jsonl.zst"),
    (".jsonl", "jsonl"),
    (".parquet", "parquet"),
    (".arrow", "arrow"),
)
# The stream each jsonl format is decompressed with (None: read as is).
COMPRESSION = {"jsonl": None, "jsonl.gz": "gzip", "jsonl.zst": "zstd"}
TABLE_FORMATS = ("parquet", "arrow")


def input_format(path: str) -> str:
    lower = path.lower()
    for suffix, fmt in _SUFFIXES:
        if lower.endswith(suffix):
            return fmt
    return "text"
