"""Reading a sweep's comparison: table rows and the PNG signature."""

from __future__ import annotations


PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def table_rows(out: str) -> list[list[str]]:
    """The body rows of the rich tables in `out`, as lists of stripped cells."""
    return [[cell.strip() for cell in line.strip().strip("│").split("│")] for line in out.splitlines()
            if line.startswith("│")]
