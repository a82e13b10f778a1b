"""Arguments and entry point of `llmtrain eval` (wired into the CLI by llmtrain.cli; no torch at import)."""

from __future__ import annotations

import argparse
import json


def add_eval_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("ckpt", metavar="CKPT|RUN_DIR",
                        help="checkpoint folder (RUN_DIR/checkpoints/step-NNNNNNN), or a run directory: its newest "
                             "complete checkpoint; either may be an object-store URI (s3://bucket/prefix/RUN: a "
                             "checkpoint location)")
    parser.add_argument("--data", action="append", default=None, metavar="FILE_OR_DIR",
                        help="a token file or shard folder from `llmtrain data prepare` to evaluate, whole, as one "
                             "source (repeatable); default: the run's own validation data (data=mix: each "
                             "source's validation split)")
    parser.add_argument("--batches", type=int, default=None, metavar="N",
                        help="batches per source (default: the run's validation data: the windows the trainer's "
                             "eval reads, train.eval_steps global batches; --data: every window)")
    parser.add_argument("--batch-size", type=int, default=None, metavar="B",
                        help="windows of model.seq_len + 1 tokens per batch, one forward each (default "
                             "train.micro_batch_size)")
    parser.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda when there is one)")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object: checkpoint, step, loss and perplexity overall and per source")


def run_eval(args: argparse.Namespace) -> int:
    """Print loss and perplexity per source and overall. LlmtrainError propagates."""
    from llmtrain.inference.checkpoint_model import resolve_checkpoint

    ckpt, from_run_dir = resolve_checkpoint(args.ckpt)  # before importing torch: a bad path fails fast
    from llmtrain.checkpoint.export import load_checkpoint_config
    from llmtrain.checkpoint.store import read_meta
    from llmtrain.errors import ConfigError

    for flag, value in (("--batches", args.batches), ("--batch-size", args.batch_size)):
        if value is not None and value < 1:
            raise ConfigError(flag, f"must be >= 1, got {value}")
    from llmtrain.inference.checkpoint_model import load_checkpoint_model, pick_device

    device = pick_device(args.device)
    cfg = load_checkpoint_config(ckpt)
    # A checkpoint's config.yaml has both batch sizes filled in at composition; 8 and one batch if not.
    batch_size = args.batch_size or int(cfg.train.micro_batch_size or 8)
    from llmtrain.inference.loss_eval import file_sources, run_val_sources

    if args.data:
        sources = file_sources(args.data, cfg, None if args.batches is None else args.batches * batch_size)
        what = ", ".join(args.data)
    else:
        trainer_windows = max(1, int(cfg.train.eval_steps)) * int(cfg.train.global_batch_size or batch_size)
        windows = trainer_windows if args.batches is None else args.batches * batch_size
        sources = run_val_sources(cfg, read_meta(ckpt) or {}, windows)
        what = "the run's validation data"

    from llmtrain.console import say
    from llmtrain.inference.loss_eval import overall_loss, perplexity, source_loss

    loaded = load_checkpoint_model(ckpt, device)
    which = f" (newest complete checkpoint of {args.ckpt})" if from_run_dir else ""
    step = "" if loaded.step is None else f", step {loaded.step}"
    say(f"evaluating {ckpt}{which}{step}, on {device}: {what}, {batch_size} windows of "
        f"{loaded.seq_len + 1} tokens per batch", err=True)
    losses = [source_loss(loaded.model, source, batch_size, device) for source in sources]
    overall = overall_loss(losses)
    if args.json:
        print(json.dumps({"checkpoint": ckpt, "step": loaded.step, "data": args.data or "validation",
                          "loss": overall, "perplexity": perplexity(overall),
                          "tokens": sum(s.tokens for s in losses),
                          "sources": {s.name: {"loss": s.loss, "perplexity": s.perplexity, "windows": s.windows,
                                               "tokens": s.tokens, **({} if s.weight is None else
                                                                      {"weight": s.weight})}
                                      for s in losses}}))
        return 0
    rows = [("source", "windows", "tokens", "loss", "perplexity")]
    rows += [(s.name, f"{s.windows:,}", f"{s.tokens:,}", f"{s.loss:.4f}", f"{s.perplexity:.2f}") for s in losses]
    if len(losses) > 1:
        weighted = all(s.weight is not None for s in losses)
        rows.append(("overall" + (" (data.sources weights)" if weighted else ""), "",
                     f"{sum(s.tokens for s in losses):,}", f"{overall:.4f}", f"{perplexity(overall):.2f}"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths))))
    return 0
