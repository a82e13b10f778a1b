"""Faults on purpose, for tests of the paths real faults take: LLMTRAIN_INJECT_NONFINITE="STEP:RANK[,STEP:RANK]"
puts an inf into one gradient of that rank after the backward of that (1-based) step, so overflow handling can be
tested where only one rank overflows. LLMTRAIN_INJECT_HANG makes one rank hang in one of three ways,
LLMTRAIN_INJECT_SLOWDOWN makes one rank a straggler, LLMTRAIN_INJECT_EXIT kills one and LLMTRAIN_INJECT_SPIKE
multiplies one batch's loss (below). Read once when training starts; without them the training loop has no hook."""

from __future__ import annotations

import math
import os
import time
from typing import Callable

import torch
from torch.distributed.tensor import DTensor

NONFINITE_ENV = "LLMTRAIN_INJECT_NONFINITE"


def gradient_fault(rank: int) -> Callable[[int, list[torch.Tensor]], None] | None:
    """A hook (step, params) for this rank, or None when no fault is asked for."""
    spec = os.environ.get(NONFINITE_ENV)
    if not spec:
        return None
    steps = {int(s) for s, r in (item.split(":") for item in spec.split(",") if item) if int(r) == rank}

    def inject(step: int, params: list[torch.Tensor]) -> None:
        if step not in steps:
            return
        for p in params:
            if p.grad is not None:
                g = p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
                if g.numel():
                    g.view(-1)[0] = float("inf")
                    return

    return inject


# LLMTRAIN_INJECT_HANG="KIND:STEP:RANK[,...]": that rank hangs in that (1-based) step, for hang-triage tests.
HANG_ENV = "LLMTRAIN_INJECT_HANG"
SKIP_COLLECTIVE = "skip_collective"  # skips the step's overflow all-reduce, then waits in the next one
SLEEP_IN_STEP = "sleep_in_step"  # sleeps after its backward
BLOCK_DATA = "block_data"  # blocks while loading the step's first micro-batch
HANG_KINDS = (SKIP_COLLECTIVE, SLEEP_IN_STEP, BLOCK_DATA)
HANG_S = 3600.0


def injected_hangs(rank: int) -> set[tuple[str, int]]:
    """{(kind, step)} asked of this rank; read once, by the trainer."""
    out = set()
    for item in filter(None, os.environ.get(HANG_ENV, "").split(",")):
        kind, step, r = item.split(":")
        if kind not in HANG_KINDS:
            raise ValueError(f"{HANG_ENV}: unknown kind {kind!r} (one of {', '.join(HANG_KINDS)})")
        if int(r) == rank:
            out.add((kind, int(step)))
    return out


def hang_here() -> None:
    """What an injected hang does: nothing for an hour (the launcher's hang detection ends it long before)."""
    time.sleep(HANG_S)


SLOWDOWN_ENV = "LLMTRAIN_INJECT_SLOWDOWN"


def compute_slowdown(rank: int) -> Callable[[int, float], None] | None:
    """LLMTRAIN_INJECT_SLOWDOWN="RANK:FACTOR:FROM_STEP[:TO_STEP]": from that (1-based) step on (to TO_STEP, when
    given), that rank sleeps inside its compute region for (FACTOR - 1) times the compute it just did, as a rank
    FACTOR times slower would take. RANK `*` slows every rank; FACTOR `Ns` sleeps a fixed N seconds a step instead,
    whatever the machine's load. A hook (step, compute seconds so far) for this rank, or None."""
    spec = os.environ.get(SLOWDOWN_ENV)
    if not spec:
        return None
    target, factor, *steps = spec.split(":")
    if target != "*" and int(target) != rank:
        return None
    first, last = int(steps[0]), int(steps[1]) if len(steps) > 1 else None
    fixed_s = float(factor[:-1]) if factor.endswith("s") else None

    def slow_down(step: int, compute_s: float) -> None:
        if step >= first and (last is None or step <= last):
            time.sleep(fixed_s if fixed_s is not None else (float(factor) - 1) * compute_s)

    return slow_down


EXIT_ENV = "LLMTRAIN_INJECT_EXIT"


def exit_fault(rank: int) -> Callable[[int], None] | None:
    """LLMTRAIN_INJECT_EXIT="STEP:RANK": that rank dies (exit 1, nothing recorded) before that (1-based) step of
    the first attempt, as a crashed process would; torchrun's restarts run on unharmed. A hook (step) or None."""
    spec = os.environ.get(EXIT_ENV)
    if not spec or int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")):
        return None
    step, target = (int(v) for v in spec.split(":"))
    if target != rank:
        return None

    def die(current: int) -> None:
        if current == step:
            os._exit(1)

    return die


SPIKE_ENV = "LLMTRAIN_INJECT_SPIKE"


def loss_spike() -> Callable[[int, int, torch.Tensor, list[torch.Tensor]], torch.Tensor] | None:
    """LLMTRAIN_INJECT_SPIKE="SAMPLE:FACTOR[,...]": the step whose global batch holds sample SAMPLE has its loss
    (and so its gradients) multiplied by FACTOR on every rank, as a bad batch would. Keyed by the sample, not the
    step: a rollback that skips the sample never meets it again, though the step numbers come again. A hook
    (samples before the step, global batch, this rank's loss, params) -> the loss, or None."""
    spec = os.environ.get(SPIKE_ENV)
    if not spec:
        return None
    spikes = [(int(s), float(f)) for s, f in (item.split(":") for item in spec.split(",") if item)]

    @torch.no_grad()
    def spike(samples_before: int, global_batch: int, loss: torch.Tensor, params: list[torch.Tensor]) -> torch.Tensor:
        factor = math.prod(f for s, f in spikes if samples_before <= s < samples_before + global_batch)
        if factor == 1:
            return loss
        for p in params:
            if p.grad is not None:
                (p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad).mul_(factor)
        return loss * factor

    return spike
