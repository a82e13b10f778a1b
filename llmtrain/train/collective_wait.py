"""Seconds each thread spends blocked in collectives, so that a rank's compute time leaves out its waits for others.

A rank that reaches a collective first waits there for the slowest one. Timed by the wall clock around forward and
backward (where FSDP, tensor and pipeline parallelism run their collectives), that wait would count as its own work,
and the rank it waited for would look no slower than it. So the calls that block on other ranks are timed and their
seconds summed per thread:

- the torch.distributed collectives and point-to-point calls, from entry to return (a synchronous one returns when
  it is done; an async one returns at once and is waited for later),
- `Work.wait()`, where an async op is waited for (FSDP's prefetching all-gathers, pipeline send/recv),
- the functional collectives' `wait_tensor`, where DTensor's (tensor parallel) collectives are waited for.

A timed call made inside another one is not counted twice (a synchronous collective waits on its own work). Only
the calling thread's sum moves: a background thread's collectives (an async checkpoint's) are none of the
trainer's waits.

On gloo the host blocks until the peers' data is in, so the sum is the time spent waiting for them plus the
transfer. Under NCCL the calls return once the work is queued on the GPU, which does the waiting, so the sum stays
near zero; collectives that torch.compile put inside a compiled graph are not seen either.
"""

from __future__ import annotations

import functools
import threading
import time

import torch
import torch.distributed as dist
from torch.distributed import _functional_collectives as funcol

# Not isend/irecv: P2POp and batch_isend_irecv tell them apart by identity. Their works are waited in Work.wait.
COLLECTIVES = ("all_reduce", "broadcast", "barrier", "monitored_barrier", "all_gather", "all_gather_into_tensor",
               "all_gather_single", "reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_single", "all_to_all",
               "all_to_all_single", "reduce", "gather", "scatter", "all_gather_object", "broadcast_object_list",
               "gather_object", "scatter_object_list", "send", "recv", "send_object_list", "recv_object_list")
_TIMED = "__llmtrain_wait_timed__"


class _Blocked(threading.local):
    seconds = 0.0  # this thread's sum
    inside = False  # within a timed call: a timed call it makes is part of it


_BLOCKED = _Blocked()


def blocked_s() -> float:
    """Seconds this thread has spent in timed collective calls since the process started."""
    return _BLOCKED.seconds


def timed(fn):
    """`fn`, with the seconds spent in it added to the calling thread's sum (unless called from a timed call)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        blocked = _BLOCKED
        if blocked.inside or torch.compiler.is_compiling():  # a graph being traced runs none of this itself
            return fn(*args, **kwargs)
        blocked.inside = True
        began = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            blocked.seconds += time.perf_counter() - began
            blocked.inside = False

    setattr(wrapper, _TIMED, True)
    return wrapper


def _time(owner, name: str) -> None:
    fn = getattr(owner, name, None)
    if fn is not None and not getattr(fn, _TIMED, False):
        setattr(owner, name, timed(fn))


def install() -> None:
    """Time the blocking calls of torch.distributed in this process (once; later calls change nothing). Callers
    that look the functions up on `torch.distributed` when they call them (llmtrain, FSDP2, pipelining) are timed;
    a name imported into a module before this runs is not. The worker installs it before collective_trace, whose
    wrappers then sit outside these and still record the caller of each collective."""
    for name in COLLECTIVES:
        _time(dist, name)
    _time(dist.Work, "wait")
    _time(funcol, "wait_tensor")
