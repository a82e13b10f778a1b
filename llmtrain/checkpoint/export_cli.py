"""Arguments and entry point of `llmtrain ckpt export` (wired into the CLI by llmtrain.cli)."""

from __future__ import annotations

import argparse

# Kept here (not imported from export.py) so building the CLI's parser does not import torch.
FORMATS = ("safetensors", "hf")


def add_export_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("ckpt", metavar="CKPT",
                        help="checkpoint folder (RUN_DIR/checkpoints/step-NNNNNNN: DCP files + config.yaml), or a "
                             "run directory: its newest complete checkpoint; either may be an object-store URI "
                             "(s3://bucket/prefix/RUN: a checkpoint location)")
    parser.add_argument("--format", required=True, choices=FORMATS, dest="format",
                        help="safetensors: model.safetensors with llmtrain names + config.yaml; "
                             "hf: a Hugging Face folder (config.json + model.safetensors) that transformers' "
                             "from_pretrained loads as the model family's class (config.json's architectures)")
    parser.add_argument("--out", required=True, metavar="DIR",
                        help="folder to create (must not exist, or be empty), or an object-store URI: written "
                             "locally, then uploaded, config.json (hf) or model.safetensors (safetensors) last")


def run_export(args: argparse.Namespace) -> int:
    """Export the checkpoint (a run directory: its newest complete one); returns the exit status. An LlmtrainError
    propagates for the CLI to report."""
    from llmtrain.checkpoint.store import checkpoint_or_newest

    ckpt, from_run_dir = checkpoint_or_newest(args.ckpt)  # before importing torch: a bad run dir fails fast
    if from_run_dir:
        print(f"exporting {ckpt} (newest complete checkpoint of {args.ckpt})", flush=True)
    from llmtrain.checkpoint.export import export_checkpoint

    summary = export_checkpoint(ckpt, args.format, args.out)
    print(f"exported {ckpt} as {summary['kind']} to {summary['out']} ({', '.join(summary['files'])}): "
          f"{summary['num_params']:,} parameters")
    return 0
