"""Why a save failed, told apart: a full disk (one clear line), an object store that did not answer (retried, in
the store's words), and what DCP wraps (each rank's own failure inside one CheckpointException)."""

from __future__ import annotations

import errno

import torch
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.stateful import Stateful
from torch.distributed.tensor import DTensor

from llmtrain.checkpoint.storage import storage_for
from llmtrain.checkpoint.storage.failures import describe
from llmtrain.errors import ObjectStoreError


def local_bytes(state: dict) -> int:
    """Bytes this rank writes for `state` (its own shards)."""
    total = 0
    for value in state.values():
        if isinstance(value, Stateful):
            value = value.state_dict()
        if isinstance(value, dict):
            total += local_bytes(value)
        elif torch.is_tensor(value):
            t = value.to_local() if isinstance(value, DTensor) else value
            total += t.numel() * t.element_size()
    return total


def out_of_space(e: BaseException, folder: str, state: dict) -> bool:
    if disk_full(e):
        return True
    if isinstance(e, (KeyboardInterrupt, SystemExit)):
        return False
    free = storage_for(folder).free_bytes(folder)
    return free is not None and free < local_bytes(state)


def disk_full(e: BaseException | None) -> bool:
    """Whether `e` (or what it wraps: DCP gathers every rank's failure into one CheckpointException) is ENOSPC."""
    seen, todo = set(), [e]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno == errno.ENOSPC:
            return True
        if isinstance(e, CheckpointException):
            todo += [f[0] if isinstance(f, tuple) else f for f in e.failures.values()]
        todo += [e.__cause__, e.__context__]
    return False


# Pauses before the tries after a failed save to an object store (throttling, a connection cut off).
STORE_BACKOFF_S = (2, 8, 30)


def remove_quietly(path: str) -> None:
    """Remove what a failed save left; a store that does not answer now leaves it for the next launch to remove
    (without meta.json it is never resumed), rather than failing rank 0 alone while the others wait."""
    try:
        storage_for(path).remove(path)
    except ObjectStoreError:
        pass


def unwrapped(e: BaseException) -> tuple[str, BaseException]:
    """DCP's CheckpointException only wraps each rank's own failure: ("rank R: ", the first rank's), else ("", e)."""
    if isinstance(e, CheckpointException) and e.failures:
        rank, cause = next(iter(sorted(e.failures.items())))
        cause = cause[0] if isinstance(cause, tuple) else cause
        if isinstance(cause, BaseException):
            return f"rank {rank}: ", cause
    return "", e


def store_reason(e: BaseException) -> str:
    """A failed save to an object store in one line, in the store's words."""
    rank, cause = unwrapped(e)
    return rank + describe(cause)
