"""Arguments and entry point of `llmtrain ckpt export` (wired into the CLI by llmtrain.cli)."""

from __future__ import annotations

import argparse

# Kept here (not imported from export.py) so building the CLI's parser does not import torch.
FORMATS = ("safetensors", "hf")


def add_export_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("ckpt", metavar="CKPT",
                        help="checkpoint folder (RUN_DIR/checkpoints/step-NNNNNNN: DCP files + config.yaml)")
    parser.add_argument("--format", required=True, choices=FORMATS, dest="format",
                        help="safetensors: model.safetensors with llmtrain names + config.yaml; "
                             "hf: a Hugging Face GPT-2 folder (config.json + model.safetensors) that "
                             "transformers.GPT2LMHeadModel.from_pretrained loads")
    parser.add_argument("--out", required=True, metavar="DIR",
                        help="folder to create (must not exist, or be empty)")


def run_export(args: argparse.Namespace) -> int:
    """Export the checkpoint; returns the exit status. A ConfigError propagates for the CLI to report."""
    from llmtrain.checkpoint.export import export_checkpoint

    summary = export_checkpoint(args.ckpt, args.format, args.out)
    kind = "Hugging Face GPT-2 folder" if summary["format"] == "hf" else "llmtrain safetensors"
    print(f"exported {args.ckpt} as {kind} to {summary['out']} ({', '.join(summary['files'])}): "
          f"{summary['num_params']:,} parameters")
    return 0
