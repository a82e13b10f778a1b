"""Arguments and entry point of `llmtrain data prepare` (wired into the CLI by llmtrain.cli)."""

from __future__ import annotations

import argparse

from .corpus import prepare_corpus, skip_summary


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
    meta = prepare_corpus(
        args.input,
        args.output,
        tokenizer=args.tokenizer,
        include=args.include,
        exclude=args.exclude,
        jsonl_key=args.jsonl_key,
        skipped=skipped,
    )
    tokenizer = "byte-level" if meta["tokenizer"] == "byte" else meta["tokenizer"]
    print(
        f"wrote {meta['num_tokens']:,} tokens ({meta['dtype']}, vocab {meta['vocab_size']}, {tokenizer}) "
        f"from {meta['sources']} file(s) to {args.output}"
    )
    if skipped:
        print(skip_summary(skipped))
    return 0
