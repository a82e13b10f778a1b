"""Each rank's last collective per process group, for hang verdicts: which op it entered, its sequence number on
that group, and whether it completed.

gloo has no flight recorder, so the torch.distributed collectives llmtrain and FSDP call are wrapped: entering one
bumps the group's sequence number, returning from it marks it completed. An async op (FSDP's prefetches) counts as
completed once the next op on its group is entered: its wait comes later, in code that is not ours. The record is a
small dict in memory; it is written out only when the launcher asks for evidence (hang_signals.py).
"""

from __future__ import annotations

import collections
import functools
import inspect
import os
import sys
import threading
import time

import torch.distributed as dist

TRACED = ("all_reduce", "broadcast", "barrier", "all_gather", "all_gather_into_tensor", "reduce_scatter_tensor",
          "reduce_scatter", "all_to_all_single", "all_gather_object", "broadcast_object_list", "reduce", "gather",
          "scatter")
# Ops kept per group with their call sites: a rank that skipped one is told apart by where it entered the next.
RECENT = 256  # a step's worth on most models: FSDP issues a few ops per layer


class CollectiveTrace:
    def __init__(self):
        self.names: dict = {}  # process group -> its name in the record ("dp", "tp", "pp", "world")
        # name -> {"op", "seq", "done", "ranks", "entered_at", "site", "recent"}: the last op entered, its number
        # on the group, the number of the last one completed, the group's global ranks, when (time.time(): the
        # launcher finds the collective that has waited longest), where from, and the last RECENT [seq, op, site]
        self.groups: dict[str, dict] = {}
        self.last: str | None = None  # the group of the collective entered last
        self.lock = threading.Lock()  # the dump thread reads while the main thread writes

    def name_group(self, group, name: str) -> None:
        self.names[group] = name

    def _group_name(self, group) -> str:
        group = dist.group.WORLD if group is None else group
        if group not in self.names:
            self.names[group] = "world" if group is dist.group.WORLD else \
                "ranks " + ",".join(map(str, dist.get_process_group_ranks(group)))
        return self.names[group]

    def entered(self, op: str, group, async_op: bool, site: str = "") -> tuple[str, int]:
        name = self._group_name(group)
        with self.lock:
            entry = self.groups.get(name)
            if entry is None:
                real = dist.group.WORLD if group is None else group
                entry = self.groups[name] = {"op": op, "seq": 0, "done": 0,
                                             "ranks": dist.get_process_group_ranks(real)}
            if entry.get("async"):
                entry["done"] = entry["seq"]
            entry.update(op=op, seq=entry["seq"] + 1, entered_at=time.time(), site=site)
            entry["async"] = async_op
            entry.setdefault("recent", collections.deque(maxlen=RECENT)).append([entry["seq"], op, site])
            self.last = name
            return name, entry["seq"]

    def completed(self, name: str, seq: int) -> None:
        with self.lock:
            entry = self.groups[name]
            entry["done"] = max(entry["done"], seq)

    def snapshot(self) -> dict:
        with self.lock:
            return {"groups": {k: dict(v, recent=list(v.get("recent", []))) for k, v in self.groups.items()},
                    "last": self.last}


TRACE = CollectiveTrace()


def _traced(op: str, fn):
    signature = inspect.signature(fn)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        bound = signature.bind_partial(*args, **kwargs).arguments
        async_op = bool(bound.get("async_op", False))
        caller = sys._getframe(1)
        site = f"{caller.f_code.co_name} ({os.path.basename(caller.f_code.co_filename)}:{caller.f_lineno})"
        name, seq = TRACE.entered(op, bound.get("group"), async_op, site)
        result = fn(*args, **kwargs)
        if not async_op:
            TRACE.completed(name, seq)
        return result

    wrapper.__llmtrain_traced__ = True
    return wrapper


def install() -> CollectiveTrace:
    """Wrap the collectives of torch.distributed in this process (once); return the trace."""
    for op in TRACED:
        fn = getattr(dist, op, None)
        if fn is not None and not getattr(fn, "__llmtrain_traced__", False):
            setattr(dist, op, _traced(op, fn))
    return TRACE
