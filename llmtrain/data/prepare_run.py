"""One run of `llmtrain data prepare`: expand the inputs, tokenize them (in worker processes when there are several),
append each unit's part file to the output in input order, and commit the output whole.

Part files live in a temp folder beside the output, deleted at the end whatever happened; the output is never seen
half-written (prepare_output.py)."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from typing import Sequence

from .encoders import BYTE_VOCAB_SIZE
from .errors import DataError
from .inputs import expand_inputs
from .prepare_options import PrepareOptions
from .prepare_output import ShardWriter, SingleFileWriter, check_output
from .prepare_pool import make_encoder, tokenized_units
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
    bytes_read: int = 0
    seconds: float = 0.0
    workers: int = 1
    not_text: list[tuple[str, str]] = field(default_factory=list)  # (name, "binary" | "compressed")
    notes: list[str] = field(default_factory=list)  # what expanding the inputs had to say
    bad_lines: int = 0
    bad_examples: list[str] = field(default_factory=list)


def prepare_tokens(inputs: Sequence[str], output: str, options: PrepareOptions, progress: bool = False
                   ) -> PrepareResult:
    """Tokenize `inputs` into `output` (one token file + FILE.json, or a shard folder with options.shard_tokens)."""
    started = time.perf_counter()
    if options.workers < 1:
        raise DataError("--workers", f"must be at least 1, got {options.workers}")
    if options.shard_tokens is not None and options.shard_tokens < 1:
        raise DataError("--shard-tokens", f"must be a positive number of tokens, got {options.shard_tokens}")
    output = os.path.abspath(os.path.expanduser(os.fspath(output)))
    sharded = options.shard_tokens is not None
    check_output(output, sharded)
    encoder = make_encoder(options)
    found = expand_inputs(inputs, {output, meta_path(output)}, options.include, options.exclude)
    units, notes = found if isinstance(found, tuple) else (found, [])
    if sharded:  # an old shard folder inside an --input folder is output, not input
        units = [unit for unit in units if not unit.path.startswith(output + os.sep)]
        if not units:
            raise DataError("--input", f"no files to tokenize outside the output folder {output}")
    sizes = [_size(unit.path) for unit in units]
    workers = min(options.workers, len(units))
    if options.tokenizer is None:
        meta = {"format": TOKEN_FORMAT, "dtype": "uint16", "vocab_size": BYTE_VOCAB_SIZE, "tokenizer": "byte"}
    else:
        meta = {"format": TOKEN_FORMAT, "dtype": encoder.dtype, "vocab_size": encoder.vocab_size,
                "tokenizer": os.path.abspath(options.tokenizer)}
    result = PrepareResult(meta, workers=workers, notes=list(notes))
    itemsize = 2 if meta["dtype"] == "uint16" else 4
    total = used = 0
    os.makedirs(os.path.dirname(output), exist_ok=True)
    parts_dir = tempfile.mkdtemp(dir=os.path.dirname(output), prefix=f".{os.path.basename(output)}.parts-")
    try:
        with contextlib.ExitStack() as stack:
            results = stack.enter_context(tokenized_units(units, options, workers, parts_dir, encoder))
            bar = stack.enter_context(PrepareProgress(len(units), sum(sizes), progress))
            writer = stack.enter_context(ShardWriter(output, options.shard_tokens, meta) if sharded
                                         else SingleFileWriter(output))
            for size, done in zip(sizes, results):
                result.bytes_read += size
                if done.stats is None:
                    result.not_text.append((done.unit.name, done.not_text))
                    bar.advance(size, 0)
                    continue
                writer.append(done.part, done.stats.tokens * itemsize)
                os.unlink(done.part)
                used += 1
                total += done.stats.tokens
                result.documents += done.stats.documents
                result.bad_lines += done.stats.bad_lines
                result.bad_examples.extend(done.stats.bad_examples[:BAD_EXAMPLES_SHOWN - len(result.bad_examples)])
                bar.advance(size, done.stats.tokens)
            if used == 0:
                raise DataError("--input", f"no text file to tokenize; {skip_summary(result.not_text)}")
            if total == 0:
                raise DataError("--input", "the input files are all empty" if options.tokenizer is None else
                                "the input files produced no tokens")
            if sharded:
                result.meta = writer.commit(total, result.documents, used)
            else:
                result.meta = {"format": TOKEN_FORMAT, "dtype": meta["dtype"], "vocab_size": meta["vocab_size"],
                               "num_tokens": total, "tokenizer": meta["tokenizer"], "sources": used}
                writer.commit(result.meta)
    finally:
        shutil.rmtree(parts_dir, ignore_errors=True)
    result.seconds = time.perf_counter() - started
    return result


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
