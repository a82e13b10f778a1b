"""One large jsonl input split among `llmtrain data prepare`'s workers. A gzip or zstd stream cannot be read from
the middle, so one reader (the command's own process) decompresses it and cuts its text at line ends into chunks
of about CHUNK_BYTES, handed to the workers in order; a plain .jsonl is cut the same way. A jsonl line is a
document encoded on its own, so the tokens of the chunks, appended in order, are the tokens of the whole file:
the output is the same for any number of workers. Text files (one document each) and tables are not split."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Iterator, Sequence

from .compressed_input import open_decompressed
from .errors import DataError
from .formats import COMPRESSION
from .prepare_options import Chunk, InputUnit
from .readers import open_input

SPLIT_FORMATS = ("jsonl", "jsonl.gz", "jsonl.zst")
# Text per chunk: a few seconds of work for a tokenizer (about 2 MB/s a core), little memory per worker.
CHUNK_BYTES = 4 << 20
# A compressed file's text is taken to be this many times its size when deciding whether and how far to split it
# (text compresses 3-5x with gzip or zstd): a wrong guess leaves a worker idle, or starts one fewer than could work.
COMPRESSED_TEXT_RATIO = 4


def text_sizes(units: Sequence[InputUnit], sizes: Sequence[int]) -> list[int]:
    """The bytes of text each unit is taken to hold."""
    return [size * COMPRESSED_TEXT_RATIO if COMPRESSION.get(unit.format) else size for unit, size in zip(units, sizes)]


def split_units(units: Sequence[InputUnit], sizes: Sequence[int], workers: int, chunk_bytes: int) -> list[bool]:
    """Which units are cut into chunks: jsonl files of more than a chunk of text and more than one worker's share of
    all input (so many files of one size go one per worker, and one big file among many is shared)."""
    texts = text_sizes(units, sizes)
    total = sum(texts)
    return [workers > 1 and unit.format in SPLIT_FORMATS and text > chunk_bytes and text * workers > total
            for unit, text in zip(units, texts)]


def pieces(units: Sequence[InputUnit], sizes: Sequence[int], split: Sequence[bool], chunk_bytes: int) -> int:
    """How many pieces of work the units make, as far as their sizes tell."""
    return sum(max(1, math.ceil(text / chunk_bytes)) if cut else 1
               for text, cut in zip(text_sizes(units, sizes), split))


def work_units(units: Sequence[InputUnit], split: Sequence[bool], chunk_bytes: int) -> Iterator[InputUnit]:
    """The units in order, each one to split replaced by its chunks, read as they are asked for."""
    for unit, cut in zip(units, split):
        if cut:
            yield from file_chunks(unit, chunk_bytes)
        else:
            yield unit


def file_chunks(unit: InputUnit, chunk_bytes: int) -> Iterator[InputUnit]:
    """`unit`'s text in chunks of `chunk_bytes` extended to the end of their last line (an empty file: one empty
    chunk). Where the file cannot be read (a corrupt or truncated stream), the last chunk carries the error, so
    that it is raised in its turn, or not at all when the file is skipped as not text before it."""
    line = 1
    index = 0
    try:
        with open_input(unit) as raw, open_decompressed(raw, COMPRESSION[unit.format], unit.name) as src:
            consumed = 0
            while True:
                data = src.read(chunk_bytes)
                if data and not data.endswith(b"\n"):
                    data += src.readline()
                last = not src.peek(1)
                position = raw.tell()  # compressed input is read ahead of the text: an estimate, for the bar
                yield replace(unit, chunk=Chunk(data, line, index, last, position - consumed))
                if last:
                    return
                consumed = position
                line += data.count(b"\n")
                index += 1
    except DataError as e:
        yield replace(unit, chunk=Chunk(b"", line, index, True, 0, error=(e.key, e.message)))
