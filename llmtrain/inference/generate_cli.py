"""Arguments and entry point of `llmtrain generate` (wired into the CLI by llmtrain.cli; no torch at import)."""

from __future__ import annotations

import argparse
import json


def add_generate_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("ckpt", metavar="CKPT|RUN_DIR",
                        help="checkpoint folder (RUN_DIR/checkpoints/step-NNNNNNN), or a run directory: its newest "
                             "complete checkpoint; either may be an object-store URI (s3://bucket/prefix/RUN: a "
                             "checkpoint location)")
    parser.add_argument("--prompt", required=True, help="the text to continue")
    parser.add_argument("--tokenizer", metavar="tokenizer.json|byte",
                        help="a Hugging Face tokenizer.json, or byte (one token per UTF-8 byte); default: the one "
                             "the run's data was prepared with (its FILE.json), byte-level for data=stdlib")
    parser.add_argument("--max-new-tokens", type=int, default=200, metavar="N",
                        help="tokens to generate at most (default 200); stops earlier at the tokenizer's "
                             "end-of-text token")
    parser.add_argument("--temperature", type=float, default=1.0, metavar="T",
                        help="sample from softmax(logits / T) (default 1.0); 0: greedy, the most likely token")
    parser.add_argument("--top-k", type=int, default=None, metavar="K", help="sample among the K most likely tokens")
    parser.add_argument("--top-p", type=float, default=None, metavar="P",
                        help="sample among the most likely tokens that together hold probability P (nucleus)")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed (default 0): the same seed, the same text")
    parser.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda when there is one)")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object: checkpoint, step, tokenizer, prompt and generated ids, text")


def run_generate(args: argparse.Namespace) -> int:
    """Print the prompt and its continuation; what was loaded and how fast on stderr. LlmtrainError propagates."""
    from llmtrain.inference.checkpoint_model import resolve_checkpoint

    ckpt, from_run_dir = resolve_checkpoint(args.ckpt)  # before importing torch: a bad path fails fast
    from llmtrain.checkpoint.export import load_checkpoint_config
    from llmtrain.checkpoint.store import read_meta
    from llmtrain.console import say
    from llmtrain.errors import ConfigError
    from llmtrain.inference.sampling import SamplingOptions

    options = SamplingOptions(args.max_new_tokens, args.temperature, args.top_k, args.top_p, args.seed)
    options.check()
    cfg = load_checkpoint_config(ckpt)
    from llmtrain.inference.tokenizer import run_tokenizer

    tokenizer = run_tokenizer(cfg, read_meta(ckpt) or {}, args.tokenizer)
    prompt_ids = tokenizer.encode(args.prompt)
    seq_len = int(cfg.model.seq_len)
    if not prompt_ids:
        raise ConfigError("--prompt", "is empty: give at least one token of text to continue")
    if len(prompt_ids) > seq_len:
        raise ConfigError("--prompt", f"is {len(prompt_ids):,} tokens, longer than the model's context of {seq_len:,} "
                                      "(model.seq_len)")

    from llmtrain.inference.checkpoint_model import load_checkpoint_model, pick_device
    from llmtrain.inference.sampling import generate

    device = pick_device(args.device)
    loaded = load_checkpoint_model(ckpt, device)
    which = f" (newest complete checkpoint of {args.ckpt})" if from_run_dir else ""
    step = "" if loaded.step is None else f", step {loaded.step}"
    say(f"generating from {ckpt}{which}{step}, on {device}; tokenizer {tokenizer.origin}", err=True)
    # Only ids the tokenizer can write out: a model.vocab_size larger than the tokenizer's leaves ids no data held.
    vocab = min(loaded.vocab_size, tokenizer.vocab_size)
    result = generate(loaded.model, prompt_ids, vocab, seq_len, options, tokenizer.eot_id, device)
    text_ids = result.new_ids[:-1] if result.stopped == "eot" else result.new_ids
    if args.json:
        print(json.dumps({"checkpoint": ckpt, "step": loaded.step, "tokenizer": tokenizer.origin,
                          "prompt": args.prompt, "prompt_ids": prompt_ids, "ids": result.new_ids,
                          "text": tokenizer.decode(text_ids), "stopped": result.stopped,
                          "seconds": round(result.seconds, 3)}))
    else:
        print(tokenizer.decode(prompt_ids + text_ids), flush=True)
    n = len(result.new_ids)
    why = "at the end-of-text token" if result.stopped == "eot" else f"after --max-new-tokens {options.max_new_tokens}"
    say(f"{n} new tokens in {result.seconds:.2f} s ({n / max(result.seconds, 1e-9):,.0f} tokens/s), stopped {why}",
        err=True)
    return 0
