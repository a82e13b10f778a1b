"""`llmtrain ckpt list RUN_DIR|URI`: every checkpoint with its step, state, size and the layout it was saved with;
with a fast tier (checkpoint.local_dir), which tier holds it.

The state comes from the launcher's checks short of the CRC32 (which reads every byte): meta.json, DCP's
.metadata, and every file of the manifest present with the size it was written with.
"""

from __future__ import annotations

import argparse
import os

from llmtrain.checkpoint import store
from llmtrain.checkpoint.location import tiers_of
from llmtrain.checkpoint.storage import is_uri, storage_for
from llmtrain.console import fold_table, get_console

CHECKS = ("checked: meta.json, .metadata, each file present with its written size (a launch also checks the CRC32s "
          "of one on a filesystem)")


def add_list_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR|URI",
                        help="a run directory (run.dir), or a checkpoint location given as an object-store URI "
                             "(s3://bucket/prefix/RUN: the run's checkpoint.dir)")


def state(info: store.CheckpointInfo) -> str:
    if info.partial:
        if not storage_for(info.path).renames:  # an object store: meta.json, written last, never came
            return f"incomplete (no {store.META}: save or upload did not finish)"
        return "incomplete (.tmp: save did not finish)"
    if info.corrupt:
        return f"corrupt ({store.META} missing or unreadable)"
    if not info.whole:  # the fast tier on each node's own disk: the other nodes' shards are on theirs
        return "this node's part (checkpoint.local_dir on each node's own disk)"
    problem = store.check(info)
    return f"corrupt ({problem})" if problem else "complete"


def run_list(args) -> int:
    # A location URI has no folder to find before it holds a checkpoint: an empty one is listed as empty.
    if not is_uri(args.run_dir) and not os.path.isdir(args.run_dir):
        raise store.CheckpointUsageError("RUN_DIR", f"no such run directory: {args.run_dir}")
    infos = store.list_checkpoints(args.run_dir)
    tiered = tiers_of(args.run_dir).local is not None
    table = fold_table(f"checkpoints of {args.run_dir}", caption=CHECKS, caption_justify="left")
    columns = ("step", "tier", "state", "size", "layout", "path") if tiered else \
        ("step", "state", "size", "layout", "path")
    for col in columns:
        table.add_column(col, justify="right" if col in ("step", "size") else "left")
    for info in infos:
        layout = info.meta.get("layout", {}) if info.meta else {}
        shown = " ".join(f"{k}={layout[k]}" for k in ("dp", "tp", "pp", "zero", "world_size") if k in layout)
        cells = [str(info.step), state(info), f"{info.size_bytes / 2**20:.1f} MiB", shown or "-", info.path]
        table.add_row(*(cells[:1] + [info.tier] + cells[1:] if tiered else cells))
    get_console().print(table if infos else f"no checkpoints in {store.checkpoints_dir(args.run_dir)}")
    return 0
