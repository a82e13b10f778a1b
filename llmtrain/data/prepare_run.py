"""One run of `llmtrain data prepare`: remove what an interrupted prepare to the same output left, expand the inputs,
tokenize them (in worker processes when there are several, a large jsonl file split among them), append each
unit's part file to the output in input order, and commit the output whole.

Part files live in a temp folder beside the output, deleted at the end whatever happened; the output is never seen
half-written (prepare_output.py)."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

from . import input_chunks
from .encoders import BYTE_VOCAB_SIZE
from .errors import DataError
from .input_chunks import pieces, split_units, work_units
from .inputs import expand_inputs
from .prepare_leftovers import clean_leftovers, temp_prefix
from .prepare_options import InputStats, PrepareOptions
from .prepare_output import ShardWriter, SingleFileWriter, check_output
from .prepare_pool import UnitResult, make_encoder, tokenized_units
from .prepare_progress import PrepareProgress
from .tokenfile import TOKEN_FORMAT, meta_path

# Bad-line examples kept for the summary, across all inputs.
BAD_EXAMPLES_SHOWN = 3
# Skipped file names listed per reason in the summary.
_LISTED_SKIPS = 3


@dataclass
class PrepareResult:
    meta: dict  # the token file's meta, or the shard folder's index
    documents: int = 0
    text_bytes: int = 0  # of text tokenized: decompressed, a table's documents as UTF-8; skipped files not counted
    seconds: float = 0.0
    workers: int = 1
    not_text: list[tuple[str, str]] = field(default_factory=list)  # (name, "binary" | "compressed")
    notes: list[str] = field(default_factory=list)  # what expanding the inputs had to say
    bad_lines: int = 0
    bad_examples: list[str] = field(default_factory=list)
    files: int = 0  # text files tokenized
    tokens: int = 0


def prepare_tokens(inputs: Sequence[str], output: str, options: PrepareOptions, progress: bool = False,
                   notify: Callable[[str], None] | None = None) -> PrepareResult:
    """Tokenize `inputs` into `output` (one token file + FILE.json, or a shard folder with options.shard_tokens).
    What is said before the work starts (leftovers of an interrupted prepare removed) goes to `notify`, else to the
    result's notes."""
    started = time.perf_counter()
    if options.workers < 1:
        raise DataError("--workers", f"must be at least 1, got {options.workers}")
    if options.shard_tokens is not None and options.shard_tokens < 1:
        raise DataError("--shard-tokens", f"must be a positive number of tokens, got {options.shard_tokens}")
    output = os.path.abspath(os.path.expanduser(os.fspath(output)))
    sharded = options.shard_tokens is not None
    check_output(output, sharded)
    early = clean_leftovers(output)  # before the inputs are listed: a leftover in an --input folder is no input
    for line in early if notify else ():
        notify(line)
    encoder = make_encoder(options)
    found = expand_inputs(inputs, {output, meta_path(output)}, options.include, options.exclude)
    units, notes = found if isinstance(found, tuple) else (found, [])
    if sharded:  # an old shard folder inside an --input folder is output, not input
        units = [unit for unit in units if not unit.path.startswith(output + os.sep)]
        if not units:
            raise DataError("--input", f"no files to tokenize outside the output folder {output}")
    sizes = [_size(unit.path) for unit in units]
    chunk_bytes = input_chunks.CHUNK_BYTES
    split = split_units(units, sizes, options.workers, chunk_bytes)
    workers = min(options.workers, pieces(units, sizes, split, chunk_bytes))
    if options.tokenizer is None:
        meta = {"format": TOKEN_FORMAT, "dtype": "uint16", "vocab_size": BYTE_VOCAB_SIZE, "tokenizer": "byte"}
    else:
        meta = {"format": TOKEN_FORMAT, "dtype": encoder.dtype, "vocab_size": encoder.vocab_size,
                "tokenizer": os.path.abspath(options.tokenizer)}
    result = PrepareResult(meta, workers=workers, notes=([] if notify else early) + list(notes))
    os.makedirs(os.path.dirname(output), exist_ok=True)
    parts_dir = tempfile.mkdtemp(dir=os.path.dirname(output), prefix=temp_prefix(output) + "parts-")
    try:
        with contextlib.ExitStack() as stack:
            work = work_units(units, split, chunk_bytes)
            results = stack.enter_context(tokenized_units(work, options, workers, parts_dir, encoder))
            bar = stack.enter_context(PrepareProgress(len(units), sum(sizes), progress))
            writer = stack.enter_context(ShardWriter(output, options.shard_tokens, meta) if sharded
                                         else SingleFileWriter(output))
            _append_in_order(results, writer, bar, result, 2 if meta["dtype"] == "uint16" else 4)
            if result.files == 0:
                raise DataError("--input", f"no text file to tokenize; {skip_summary(result.not_text)}")
            if result.tokens == 0:
                raise DataError("--input", "the input files are all empty" if options.tokenizer is None else
                                "the input files produced no tokens")
            if sharded:
                result.meta = writer.commit(result.tokens, result.documents, result.files)
            else:
                result.meta = {"format": TOKEN_FORMAT, "dtype": meta["dtype"], "vocab_size": meta["vocab_size"],
                               "num_tokens": result.tokens, "tokenizer": meta["tokenizer"], "sources": result.files}
                writer.commit(result.meta)
    finally:
        shutil.rmtree(parts_dir, ignore_errors=True)
    result.seconds = time.perf_counter() - started
    return result


def _append_in_order(results: Iterator[UnitResult], writer, bar: PrepareProgress, result: PrepareResult,
                     itemsize: int) -> None:
    """Append each unit's part file to the output in input order and count the files in `result`. A file is counted
    at its last chunk; one with a chunk that is not text is skipped whole: what its earlier chunks appended is
    taken back and its later chunks (and their errors) are dropped, as reading it in one piece would."""
    skipping = None  # the file whose remaining chunks are dropped
    mark, file = None, InputStats()
    for done in results:
        unit = done.unit
        if not unit.first and unit.path == skipping:
            if done.part:
                os.unlink(done.part)
            bar.advance(unit.chunk.input_bytes, 0, files=int(unit.last))
            continue
        if done.error is not None:
            raise done.error
        if unit.first:
            mark, file, skipping = writer.mark(), InputStats(), None
        read = unit.chunk.input_bytes if unit.chunk is not None else _size(unit.path)
        if done.stats is None:
            if not unit.first:
                writer.rollback(mark)
            result.not_text.append((unit.name, done.not_text))
            skipping = unit.path
            bar.advance(read, 0, files=int(unit.last))
            continue
        writer.append(done.part, done.stats.tokens * itemsize)
        os.unlink(done.part)
        file.add(done.stats, BAD_EXAMPLES_SHOWN)
        bar.advance(read, done.stats.tokens, files=int(unit.last))
        if unit.last:
            result.files += 1
            result.tokens += file.tokens
            result.documents += file.documents
            result.text_bytes += file.text_bytes
            result.bad_lines += file.bad_lines
            result.bad_examples.extend(file.bad_examples[:BAD_EXAMPLES_SHOWN - len(result.bad_examples)])


def skip_summary(skipped: Sequence[tuple[str, str]]) -> str:
    """'skipped 3 file(s) that are not text: 2 binary (a.pyc, tool), 1 compressed (b.gz)' from (name, reason)."""
    parts = []
    for reason in ("binary", "compressed"):
        names = [name for name, why in skipped if why == reason]
        if names:
            listed = ", ".join(names[:_LISTED_SKIPS])
            if len(names) > _LISTED_SKIPS:
                listed += f", +{len(names) - _LISTED_SKIPS} more"
            parts.append(f"{len(names)} {reason} ({listed})")
    return f"skipped {len(skipped)} file(s) that are not text: {', '.join(parts)}"


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0  # unreadable: tokenizing it reports why
