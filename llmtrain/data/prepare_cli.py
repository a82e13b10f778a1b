"""Arguments and entry point of `llmtrain data prepare` (wired into the CLI by llmtrain.cli)."""

from __future__ import annotations

import argparse
import codecs
import os
import sys

from llmtrain.console import say
from llmtrain.errors import EXIT_INTERRUPTED, EXIT_OK

from .errors import DataError
from .prepare_options import PrepareOptions
from .prepare_pool import default_workers
from .prepare_run import PrepareResult, prepare_tokens, skip_summary
from .tokenfile import meta_path


def add_prepare_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--input",
        nargs="+",
        required=True,
        metavar="PATH",
        help="files or directories (all files under them, sorted) to tokenize, in this order: text files, .jsonl "
        "(one document per line; also .jsonl.gz, .json.gz, .jsonl.zst), .txt.gz, .txt.zst, .parquet, and datasets "
        "folders (save_to_disk); other files that are not text (binary, compressed) are skipped and reported",
    )
    parser.add_argument(
        "--output",
        required=True,
        metavar="FILE",
        help="token file to write (nanoGPT .bin format); its meta goes to FILE.json (with --shard-tokens: a folder)",
    )
    parser.add_argument(
        "--tokenizer",
        default=None,
        metavar="tokenizer.json",
        help="Hugging Face tokenizer file (needs the 'tokenizers' package); default: one token per byte",
    )
    parser.add_argument(
        "--include",
        action="append",
        default=[],
        metavar="GLOB",
        help="read only files under an --input directory whose relative path or name matches GLOB "
        "(repeatable; default: all files)",
    )
    parser.add_argument(
        "--exclude",
        action="append",
        default=[],
        metavar="GLOB",
        help="skip files and folders under an --input directory whose relative path or name matches GLOB "
        "(repeatable)",
    )
    parser.add_argument(
        "--text-key",
        "--jsonl-key",
        dest="text_key",
        default="text",
        metavar="KEY",
        help="field of each jsonl line's JSON object, or column of a parquet file or datasets folder, that holds "
        "the document text (default: text; --jsonl-key is its older name)",
    )
    parser.add_argument(
        "--encoding",
        default="utf-8",
        metavar="NAME",
        help="encoding of text files and jsonl lines, e.g. latin-1 (default: utf-8); text is written as UTF-8, "
        "a file not valid in it is skipped as binary",
    )
    parser.add_argument(
        "--on-bad-line",
        choices=("stop", "skip"),
        default="stop",
        help="a malformed jsonl line or table row (not JSON, not an object, no text, null): stop with an error "
        "naming FILE:LINE (default), or skip it, count it and name the first few",
    )
    parser.add_argument(
        "--separator",
        default=None,
        metavar="BYTE",
        help="byte-level: a byte written after every document, as 0-255 or an escape like '\\n' or '\\0' "
        "(default: none, documents follow each other as is)",
    )
    parser.add_argument(
        "--eot-token",
        default=None,
        metavar="TOKEN",
        help="with --tokenizer: the token written after every document (default: the first of <|endoftext|>, "
        "<|end_of_text|>, </s>, <eos> the tokenizer has); none: no token",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=None,
        metavar="N",
        help="processes that tokenize files at once, or chunks of one large jsonl file (default: this machine's "
        "cores); the output is the same for any N",
    )
    parser.add_argument(
        "--shard-tokens",
        type=int,
        default=None,
        metavar="N",
        help="write --output as a folder of shards of N tokens each (shard-00000.bin, ... with their meta) and "
        "index.json",
    )


def parse_separator(value: str | None) -> int | None:
    """--separator's byte: a number (10, 0x0a) or one character, escapes allowed (\\n, \\0, \\t)."""
    if value is None:
        return None
    try:
        number = int(value) if value.isdigit() else int(value, 0)
    except ValueError:
        try:
            text = codecs.decode(value, "unicode_escape")
        except UnicodeDecodeError:
            text = ""
        if len(text) != 1 or ord(text) > 255:
            raise DataError("--separator", f"expected a byte 0-255 or one escaped character like \\n, got {value!r}") \
                from None
        return ord(text)
    if not 0 <= number <= 255:
        raise DataError("--separator", f"expected a byte 0-255, got {value}")
    return number


def run_prepare(args: argparse.Namespace) -> int:
    """Write the token file (or shard folder); returns the exit status. A DataError propagates for the CLI to
    report."""
    options = PrepareOptions(
        tokenizer=args.tokenizer,
        include=tuple(args.include),
        exclude=tuple(args.exclude),
        text_key=args.text_key,
        encoding=args.encoding,
        on_bad_line=args.on_bad_line,
        separator=parse_separator(args.separator),
        eot_token=args.eot_token,
        workers=args.workers if args.workers is not None else default_workers(),
        shard_tokens=args.shard_tokens,
    )
    before = _identity(args.output)
    try:
        result = prepare_tokens(args.input, args.output, options, progress=sys.stderr.isatty(),
                                notify=lambda line: print(line, flush=True))
    except KeyboardInterrupt:
        say(f"interrupted: {_interrupted(args.output, before)}", err=True)
        return EXIT_INTERRUPTED
    for note in result.notes:
        print(note)
    print(summary_line(result, args.output))
    if result.not_text:
        print(skip_summary(result.not_text))
    if result.bad_lines:
        print(f"skipped {result.bad_lines:,} malformed line(s), e.g.:")
        for example in result.bad_examples:
            print(f"  {example}")
    return EXIT_OK


def summary_line(result: PrepareResult, output: str) -> str:
    """'wrote 1,234 tokens (uint16, vocab 256, byte-level) from 2 file(s) to OUT: 3 documents (mean 411 tokens),
    0.0 MB of text in 0.1 s (0.1 MB/s, 2 workers)'; the documents part only when the readers counted them. The
    megabytes are of text as the tokenizer was given it: decompressed, a table's documents only."""
    meta = result.meta
    tokenizer = "byte-level" if meta["tokenizer"] == "byte" else meta["tokenizer"]
    where = f"{len(meta['shards'])} shard(s) in {output}" if "shards" in meta else output
    line = (f"wrote {meta['num_tokens']:,} tokens ({meta['dtype']}, vocab {meta['vocab_size']}, {tokenizer}) "
            f"from {meta['sources']} file(s) to {where}:")
    if result.documents:
        line += f" {result.documents:,} documents (mean {meta['num_tokens'] / result.documents:,.0f} tokens),"
    megabytes = result.text_bytes / 1e6  # of text, decompressed: what the tokenizer was given
    speed = megabytes / result.seconds if result.seconds > 0 else 0.0
    workers = f"{result.workers} worker" + ("s" if result.workers != 1 else "")
    return f"{line} {megabytes:,.1f} MB of text in {result.seconds:.1f} s ({speed:,.1f} MB/s, {workers})"


def _identity(path: str) -> tuple | None:
    """What tells a file replaced (a new inode, size or time) from the one there before; None when absent."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


def _interrupted(output: str, before: tuple | None) -> str:
    """What a Ctrl-C left: the temp files are gone; the token file and its meta are replaced together or not at
    all, a shard folder whole or not at all (signals are held while they are renamed)."""
    folder = os.path.isdir(output)
    if _identity(output) != before:
        if folder:
            return f"{output} (a shard folder) was written just before it"
        return f"{output} and {meta_path(output)} were written just before it"
    if before is None:
        return f"nothing was written ({output} does not exist)"
    if folder:
        return f"nothing was written ({output} and its shards are as they were)"
    return f"nothing was written ({output} and its meta are as they were)"
