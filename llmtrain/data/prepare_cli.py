"""Arguments and entry point of `llmtrain data prepare` (wired into the CLI by llmtrain.cli)."""

from __future__ import annotations

import argparse
import os
import sys

from .corpus import meta_path, prepare_corpus, skip_summary

EXIT_INTERRUPTED = 130


def add_prepare_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--input",
        nargs="+",
        required=True,
        metavar="PATH",
        help="text files or directories (all files under them, sorted) to tokenize, in this order; files that "
        "are not text (binary, compressed) are skipped and reported; a .jsonl file holds one document per line",
    )
    parser.add_argument(
        "--output",
        required=True,
        metavar="FILE",
        help="token file to write (nanoGPT .bin format); its meta goes to FILE.json",
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
        "--jsonl-key",
        default="text",
        metavar="KEY",
        help="field of each .jsonl line's JSON object that holds the document text (default: text)",
    )


def run_prepare(args: argparse.Namespace) -> int:
    """Write the token file; returns the exit status. A DataError propagates for the CLI to report."""
    skipped: list[tuple[str, str]] = []
    before = _identity(args.output)
    try:
        meta = prepare_corpus(
            args.input,
            args.output,
            tokenizer=args.tokenizer,
            include=args.include,
            exclude=args.exclude,
            jsonl_key=args.jsonl_key,
            skipped=skipped,
        )
    except KeyboardInterrupt:
        print(f"llmtrain: interrupted: {_interrupted(args.output, before)}", file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED
    tokenizer = "byte-level" if meta["tokenizer"] == "byte" else meta["tokenizer"]
    print(
        f"wrote {meta['num_tokens']:,} tokens ({meta['dtype']}, vocab {meta['vocab_size']}, {tokenizer}) "
        f"from {meta['sources']} file(s) to {args.output}"
    )
    if skipped:
        print(skip_summary(skipped))
    return 0


def _identity(path: str) -> tuple | None:
    """What tells a file replaced (a new inode, size or time) from the one there before; None when absent."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


def _interrupted(output: str, before: tuple | None) -> str:
    """What a Ctrl-C left: the temp files are gone; the token file and its meta are replaced together or not at
    all (prepare_corpus holds the signal while it renames them)."""
    if _identity(output) != before:
        return f"{output} and {meta_path(output)} were written just before it"
    if before is None:
        return f"nothing was written ({output} does not exist)"
    return f"nothing was written ({output} and its meta are as they were)"
