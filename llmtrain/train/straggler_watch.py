"""Straggler detection across ranks: each rank's compute time per log interval, one all_gather, one named line.

What counts as compute: the forward/backward of a step plus the optimizer step, less the time the rank spent
blocked in collectives inside them (collective_wait): the all-gathers, reduce-scatters and all-reduces FSDP runs in
its forward and backward hooks, the tensor parallel collectives, pipeline send/recv. So a fast rank's wait for a
slow one is not its compute, and a rank slowed from outside (stopped, CPU-throttled, sharing its core) shows its own
slowdown.
The gradient-norm and flag all-reduces, data loading, logging and checkpoint saves are outside the regions.
On CPU the regions are timed with the wall clock. On CUDA they are timed with events on the device's stream, which
include the compute stream's waits for collectives (NCCL waits on the GPU, not in the host calls timed here).
"""

from __future__ import annotations

import os
import socket
import time
from typing import Callable

import torch
import torch.distributed as dist

from llmtrain.rundir.node_ledger import record_node_event

from llmtrain.train import collective_wait
from llmtrain.train.straggler import StragglerStreaks


class ComputeClock:
    """Sums the compute regions of this rank between two take() calls, less the collectives' waits inside them."""

    def __init__(self, device: torch.device, enabled: bool = True):
        """Disabled, it sums nothing and times no collective (stop() still returns the region's host seconds)."""
        self.enabled = enabled
        self.cuda = enabled and device.type == "cuda"
        self.events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        self.total_s = 0.0
        self.started: float | None = None
        self.blocked_at_start = 0.0
        self.start_event = None
        if enabled:
            collective_wait.install()

    def start(self) -> None:
        self.started = time.perf_counter()
        self.blocked_at_start = collective_wait.blocked_s()
        if self.cuda:
            self.start_event = torch.cuda.Event(enable_timing=True)
            self.start_event.record()

    def stop(self) -> float:
        """Ends the region; its host seconds less those blocked in collectives (on CUDA, the time to queue its
        work)."""
        host_s = time.perf_counter() - self.started - (collective_wait.blocked_s() - self.blocked_at_start)
        if self.cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self.events.append((self.start_event, end))
        elif self.enabled:
            self.total_s += host_s
        return host_s

    def take(self) -> float:
        """Compute seconds since the last take (waits for the device's queued work when timing with events)."""
        if self.events:
            self.events[-1][1].synchronize()
            self.total_s += sum(start.elapsed_time(end) for start, end in self.events) / 1000
            self.events = []
        total, self.total_s = self.total_s, 0.0
        return total


class StragglerWatch:
    def __init__(self, launch_cfg, clock: ComputeClock, log: Callable[..., None], device: torch.device,
                 ledger_dir: str | None = None):
        """Every rank builds it (it gathers every rank's host and local rank once); `clock` times the trainer's
        compute regions; `log` prints on rank 0; `device` is where the process group's tensors live (NCCL
        gathers CUDA tensors only); `ledger_dir`, given on one rank, is the run directory whose nodes.json gets
        a `straggler` event for each rank named."""
        self.clock = clock
        self.device = device
        self.ledger_dir = ledger_dir
        self.streaks = StragglerStreaks(launch_cfg.straggler_factor, launch_cfg.straggler_intervals)
        self.log = log
        self.world = dist.get_world_size()
        places: list = [None] * self.world
        dist.all_gather_object(places, (socket.gethostname(), int(os.environ.get("LOCAL_RANK", 0))))
        self.places = places
        self.judged = False  # the first interval of a launch carries one-time work (allocations, warm-up): not judged

    def interval_done(self) -> list[dict]:
        """Called by every rank on each logged step: the stragglers named now, [{rank, host, slowdown}]."""
        mine = torch.tensor([self.clock.take()], dtype=torch.float64, device=self.device)
        times = [torch.zeros(1, dtype=torch.float64, device=self.device) for _ in range(self.world)]
        dist.all_gather(times, mine)  # the interval's one collective: a float per rank
        named = []
        if not self.judged:
            self.judged = True
            return named
        for s in self.streaks.observe([t.item() for t in times]):
            host, local_rank = self.places[s.rank]
            self.log(f"llmtrain: straggler: rank {s.rank} (host {host}, local rank {local_rank}) {s.slowdown:.2f}x "
                     f"the median compute time for {s.intervals} intervals", flush=True)
            named.append({"rank": s.rank, "host": host, "slowdown": round(s.slowdown, 3)})
            if self.ledger_dir:
                record_node_event(self.ledger_dir, host, "straggler",
                                  f"rank {s.rank} {s.slowdown:.2f}x the median compute time for {s.intervals} intervals")
        return named


def watch_stragglers(launch_cfg, device: torch.device, log: Callable[..., None], run_dir: str,
                     is_logger: bool) -> tuple[ComputeClock, StragglerWatch | None]:
    """The trainer's compute clock, and the watch when launch.straggler_factor turns detection on (0: off) and
    there are ranks to compare (a job of one rank has no straggler: no clock, no gather per logged step)."""
    watch = bool(launch_cfg.straggler_factor) and dist.get_world_size() > 1
    clock = ComputeClock(device, enabled=watch)
    if not watch:
        return clock, None
    return clock, StragglerWatch(launch_cfg, clock, log, device, run_dir if is_logger else None)
