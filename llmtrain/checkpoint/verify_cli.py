"""Arguments and entry point of `llmtrain ckpt verify` (wired into the CLI by llmtrain.cli)."""

from __future__ import annotations

import argparse

from llmtrain.checkpoint import store
from llmtrain.checkpoint.storage import storage_for
from llmtrain.console import say
from llmtrain.errors import EXIT_OK


def add_verify_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", metavar="CKPT|RUN_DIR",
                        help="a checkpoint folder, or a run directory: its newest checkpoint (--all: every one); "
                             "either may be an object-store URI (s3://bucket/prefix/RUN: a checkpoint location)")
    parser.add_argument("--all", action="store_true", dest="every",
                        help="with a run directory: verify every checkpoint, not only the newest")


def targets(path: str, every: bool) -> list[str]:
    """The checkpoint folders to verify; a .tmp folder (its save did not finish) is never one."""
    if not store.exists(path):
        raise store.CheckpointUsageError(path, "no such checkpoint folder or run directory")
    if store.is_checkpoint_folder(path):
        return [path]
    finished = [i.path for i in store.list_checkpoints(path) if not i.partial]
    if not finished:
        raise store.CheckpointUsageError(path, f"no finished checkpoint in {store.checkpoints_dir(path)}")
    return finished if every else finished[-1:]


def summary_line(path: str, summary) -> str:
    layout = summary.layout or {}
    shown = " ".join(f"{k}={layout[k]}" for k in ("dp", "tp", "pp", "zero", "world_size") if k in layout)
    checks = "crc32 ok" if summary.checksummed else "checksums not checked (meta.json records none)"
    return (f"{storage_for(path).basename(path)}: ok: {summary.files} files, "
            f"{summary.bytes / 2**20:.1f} MiB, {summary.tensors} tensors finite, {checks}, "
            f"chunks cover every tensor{', layout ' + shown if shown else ''}; {summary.seconds:.2f} s")


def run_verify(args: argparse.Namespace) -> int:
    """0 when every checkpoint verifies, 1 naming the first problem of each that does not."""
    paths = targets(args.path, args.every)
    from llmtrain.checkpoint.verify import VerifyError, verify_checkpoint

    failed = 0
    for path in paths:
        try:
            print(summary_line(path, verify_checkpoint(path)), flush=True)
        except VerifyError as e:
            failed += 1
            say(f"verify failed: {e}", err=True)
    if failed and len(paths) > 1:
        say(f"{failed} of {len(paths)} checkpoints failed verification", err=True)
    return VerifyError.exit_code if failed else EXIT_OK
