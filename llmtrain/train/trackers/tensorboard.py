"""Metrics rows as TensorBoard scalars, written with torch.utils.tensorboard.

The `tensorboard` package is an optional extra (pip install 'llmtrain[tensorboard]'); `tensorboard_missing()`
says so before anything starts, without importing it.
"""

from __future__ import annotations

import math
import numbers
import os
import struct

from llmtrain.config.errors import ConfigError
from llmtrain.extras import missing_extra

INSTALL = "pip install 'llmtrain[tensorboard]' (in a checkout: pip install -e '.[tensorboard]')"
# Every event file llmtrain writes ends in this, after the name TensorBoard gives it.
FILE_SUFFIX = ".llmtrain"


def tensorboard_missing() -> str | None:
    """Why TensorBoard event files cannot be written here, or None. Looked up without importing tensorboard."""
    return missing_extra("tensorboard")


def _summary_writer_class(key: str):
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as e:  # also a tensorboard too old for torch
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(key, f"needs the tensorboard package ({reason}): {INSTALL}") from None
    return SummaryWriter


def _as_float32(value) -> float | None:
    """`value` as a finite float32-representable float, or None when it is not numeric/finite."""
    if value is None or isinstance(value, (bool, str, bytes)):
        return None
    if not isinstance(value, numbers.Real):
        try:
            value = float(value)  # 0-d tensors, numpy scalars
        except (TypeError, ValueError):
            return None
    try:
        value = struct.unpack("<f", struct.pack("<f", float(value)))[0]
    except (TypeError, ValueError, OverflowError):  # OverflowError: past float32's range
        return None
    return value if math.isfinite(value) else None


class TensorBoardWriter:
    """Scalars by step into a new `log_dir/events.out.tfevents.*.llmtrain` (its name in `path`)."""

    def __init__(self, log_dir: str | os.PathLike, key: str = "logging.tensorboard"):
        """`key`: the config key or flag that asked for TensorBoard, named by the error when it is missing."""
        summary_writer = _summary_writer_class(key)
        self.log_dir = os.fspath(log_dir)
        os.makedirs(self.log_dir, exist_ok=True)
        before = set(os.listdir(self.log_dir))
        self._writer = summary_writer(log_dir=self.log_dir, filename_suffix=FILE_SUFFIX)
        created = sorted(set(os.listdir(self.log_dir)) - before)  # the writer creates its file at once
        self.path = os.path.join(self.log_dir, created[-1])

    def add_scalars(self, step: int, values: dict[str, float], wall_time: float | None = None) -> int:
        """Every numeric, finite value of `values` as a scalar at `step` (others are skipped); returns how many."""
        if self._writer is None:
            raise ValueError(f"{self.path}: writer is closed")
        written = 0
        for tag, value in values.items():
            v = _as_float32(value)
            if v is not None:
                self._writer.add_scalar(str(tag), v, global_step=int(step),
                                        walltime=None if wall_time is None else float(wall_time))
                written += 1
        return written

    def flush(self) -> None:
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def __enter__(self) -> "TensorBoardWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
