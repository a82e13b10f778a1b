"""metrics.jsonl: one JSON object per logged step (and per eval), appended and flushed as it happens so the
launcher's live view and `tail -f` see it at once."""

from __future__ import annotations

import json
import math
import os


class MetricsWriter:
    def __init__(self, path: str | None, keep_until_step: int = 0, tensorboard_dir: str | None = None):
        """Open `path` keeping only rows with step <= keep_until_step (0: a fresh run starts an empty file);
        with tensorboard_dir, every row also goes to TensorBoard event files there."""
        self.file = None
        self.tensorboard = None
        if tensorboard_dir:
            from llmtrain.report.tensorboard import TensorBoardWriter

            self.tensorboard = TensorBoardWriter(tensorboard_dir)
        if not path:
            return
        kept = [row for row in read_metrics(path) if row.get("step", 0) <= keep_until_step] if keep_until_step else []
        tmp = f"{path}.tmp"
        with open(tmp, "w") as f:
            f.writelines(json.dumps(row) + "\n" for row in kept)
        os.replace(tmp, path)
        self.file = open(path, "a", buffering=1)

    def write(self, row: dict) -> None:
        if self.file is None:
            return
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}
        self.file.write(json.dumps(clean) + "\n")
        self.file.flush()
        os.fsync(self.file.fileno())
        if self.tensorboard is not None:
            prefix = "val/" if "val_loss" in row else "train/"
            self.tensorboard.add_scalars(row["step"], {prefix + k.replace("val_", ""): v for k, v in row.items()
                                                       if k != "step"})
            self.tensorboard.flush()

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None
        if self.tensorboard is not None:
            self.tensorboard.close()
            self.tensorboard = None


def read_metrics(path: str) -> list[dict]:
    rows = []
    try:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line:
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError:
                        break  # a line still being written
    except FileNotFoundError:
        pass
    return rows
