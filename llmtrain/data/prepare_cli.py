"""Arguments and entry point of `llmtrain data prepare` (wired into the CLI by llmtrain.cli)."""

from __future__ import annotations

import argparse

from .corpus import prepare_corpus


def add_prepare_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--input",
        nargs="+",
        required=True,
        metavar="PATH",
        help="text files or directories (all files under them, sorted) to tokenize, in this order",
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


def run_prepare(args: argparse.Namespace) -> int:
    """Write the token file; returns the exit status. A DataError propagates for the CLI to report."""
    meta = prepare_corpus(args.input, args.output, tokenizer=args.tokenizer)
    tokenizer = "byte-level" if meta["tokenizer"] == "byte" else meta["tokenizer"]
    print(
        f"wrote {meta['num_tokens']:,} tokens ({meta['dtype']}, vocab {meta['vocab_size']}, {tokenizer}) "
        f"from {meta['sources']} file(s) to {args.output}"
    )
    return 0
