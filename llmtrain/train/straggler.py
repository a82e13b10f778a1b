"""Which ranks are stragglers, from each log interval's per-rank compute times (pure logic, no collectives).

A rank is slow in an interval when its compute time exceeds the reference by launch.straggler_factor; it is named a
straggler once it has been slow for launch.straggler_intervals consecutive intervals, and named again after as many
more. The reference is the lower median of the ranks' times: with two ranks the healthy one is the reference (the
plain median would sit halfway and halve the slowdown it reports)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Straggler:
    rank: int
    slowdown: float  # compute time over the lower median, averaged over the streak's intervals
    intervals: int


def lower_median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[(len(ordered) - 1) // 2]


class StragglerStreaks:
    def __init__(self, factor: float, intervals: int):
        self.factor = factor
        self.intervals = intervals
        self.streaks: dict[int, list[float]] = {}  # rank -> slowdowns of its open streak

    def observe(self, times: list[float]) -> list[Straggler]:
        """One interval's compute time per rank (index = rank); the ranks whose streak reaches the threshold now."""
        reference = lower_median(times)
        named = []
        for rank, seconds in enumerate(times):
            slowdown = seconds / reference if reference > 0 else 1.0
            if slowdown <= self.factor:
                self.streaks.pop(rank, None)
                continue
            streak = self.streaks.setdefault(rank, [])
            streak.append(slowdown)
            if len(streak) == self.intervals:
                named.append(Straggler(rank, sum(streak) / len(streak), len(streak)))
                del self.streaks[rank]
        return named
