"""A rank's compute time leaves out the time it spends blocked in collectives (collective_wait), in one process:
stand-in collectives that sleep, timed the way torch.distributed's are."""

from __future__ import annotations

import threading
import time

import torch
import torch.distributed as dist
from torch.distributed import _functional_collectives as funcol

from llmtrain.train import collective_wait
from llmtrain.train.straggler_watch import ComputeClock

CPU = torch.device("cpu")


def busy(seconds: float) -> None:
    """Compute for `seconds` of wall time (descheduled or not, the region lasts that long)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


waiting = collective_wait.timed(time.sleep)  # a collective that waits `seconds` for its peers


def test_a_region_counts_its_compute_and_not_its_waits():
    clock = ComputeClock(CPU)
    clock.start()
    busy(0.05)
    waiting(0.2)
    busy(0.05)
    own = clock.stop()
    # 0.1 s of compute (and the few microseconds around the calls); the 0.2 s wait is not the rank's.
    assert 0.1 <= own < 0.13, own
    clock.start()
    busy(0.03)
    clock.stop()
    assert 0.13 <= clock.take() < 0.17
    assert clock.take() == 0.0  # taken: the next interval starts from nothing


def test_a_wait_inside_a_timed_call_is_counted_once():
    def collective():
        waiting(0.1)  # a synchronous collective waits on its own work handle
        time.sleep(0.1)

    outer = collective_wait.timed(collective)
    before = collective_wait.blocked_s()
    outer()
    assert 0.2 <= collective_wait.blocked_s() - before < 0.25


def test_another_threads_waits_are_not_taken_from_this_threads_compute():
    clock = ComputeClock(CPU)
    background = threading.Thread(target=waiting, args=(0.2,))  # an async checkpoint's collectives
    clock.start()
    background.start()
    busy(0.2)
    background.join()
    own = clock.stop()
    assert 0.2 <= own < 0.3, own


def test_a_wait_that_raises_is_still_a_wait_and_ends_the_timed_call():
    def times_out():
        time.sleep(0.1)
        raise RuntimeError("timed out")

    failing = collective_wait.timed(times_out)
    before = collective_wait.blocked_s()
    try:
        failing()
    except RuntimeError:
        pass
    assert 0.1 <= collective_wait.blocked_s() - before < 0.15
    waiting(0.05)  # not taken for a call nested in the failed one
    assert 0.15 <= collective_wait.blocked_s() - before < 0.2


def test_the_clock_times_torch_distributed_once_and_leaves_point_to_point_ops_alone():
    ComputeClock(CPU)
    ComputeClock(CPU)  # a second clock wraps nothing again
    for fn in (dist.all_reduce, dist.all_gather_single, dist.reduce_scatter_single, dist.barrier, dist.Work.wait,
               funcol.wait_tensor):
        assert getattr(fn, "__llmtrain_wait_timed__", False), fn
        assert not getattr(fn.__wrapped__, "__llmtrain_wait_timed__", False), fn
    # P2POp and batch_isend_irecv tell isend from irecv by identity; their works are timed in Work.wait.
    assert dist.isend is dist.distributed_c10d.isend and dist.irecv is dist.distributed_c10d.irecv


def test_a_disabled_clock_sums_nothing_and_returns_the_region_less_its_waits():
    clock = ComputeClock(CPU, enabled=False)
    clock.start()
    busy(0.03)
    waiting(0.05)
    assert 0.03 <= clock.stop() < 0.05
    assert clock.take() == 0.0
