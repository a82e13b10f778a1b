"""The loss-spike rule (train.spike): a step whose metric (the loss, or the gradient norm) exceeds the mean plus
sigma standard deviations of the trailing window is a spike. Pure: it is handed the globally reduced values every
rank already holds, so every rank reaches the same verdict without a collective of its own.

Only finite values of applied steps enter the window: a spike that is not applied (stop, rollback) does not widen
the band it is judged by, and a non-finite step is the streak counter's (train.max_bad_steps) business, not this
rule's. Under warn the spike's update is applied, so its value enters the window: a lasting rise is said for a
while, until the window has taken it in, not at every step from then on.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass

STOP, ROLLBACK, WARN = "stop", "rollback", "warn"


@dataclass(frozen=True)
class Spike:
    step: int  # the (1-based) step whose metric spiked
    metric: str
    value: float
    mean: float
    std: float
    sigma: float
    window: int

    def rule(self) -> str:
        """The rule that fired, with its numbers."""
        return (f"{self.metric} {self.value:.4g} > mean {self.mean:.4g} + {self.sigma:g} x std {self.std:.4g} of "
                f"the last {self.window} steps (train.spike.sigma={self.sigma:g})")


class SpikeRule:
    def __init__(self, metric: str, window: int, sigma: float, admit_spikes: bool = False):
        """`admit_spikes`: a spike's value enters the window too (policy warn: its update is applied)."""
        self.metric, self.sigma, self.admit_spikes = metric, sigma, admit_spikes
        self.values: deque[float] = deque(maxlen=window)

    def judge(self, step: int, loss: float, grad_norm: float, skipped: bool) -> Spike | None:
        """The verdict on one step (None: no spike). No verdict before the window is full."""
        value = loss if self.metric == "loss" else grad_norm
        if skipped or not math.isfinite(value):
            return None
        if len(self.values) == self.values.maxlen:
            mean, std = statistics.fmean(self.values), statistics.pstdev(self.values)
            if value > mean + self.sigma * std:
                spike = Spike(step, self.metric, value, mean, std, self.sigma, len(self.values))
                if self.admit_spikes:
                    self.values.append(value)
                return spike
        self.values.append(value)
        return None


def action(policy: str, rollbacks_so_far: int, max_rollbacks: int) -> str:
    """What a spike does: the policy, except that a rollback past train.spike.max_rollbacks is a stop."""
    if policy == ROLLBACK and rollbacks_so_far >= max_rollbacks:
        return STOP
    return policy


def skipped_range(checkpoint_samples: int, spike_start: int, global_batch: int, margin_steps: int) -> tuple[int, int]:
    """The global samples [start, end) a rollback skips: from the checkpoint's position through the spike step
    (which began at sample `spike_start`) and margin_steps more steps of `global_batch` samples."""
    return checkpoint_samples, spike_start + (1 + margin_steps) * global_batch
