"""When a checkpoint is saved on the way: every checkpoint.interval steps, and every checkpoint.interval_minutes of
training time, so that a crash (a killed worker, a lost node) costs at most that much work.

The time is rank 0's clock alone: each rank deciding by its own clock could save at different steps, and a save
is collective. Rank 0's vote rides on the MAX all-reduce that the preemption flag makes at every step boundary
anyway (the other ranks vote 0), so the time check adds no collective and no host sync of its own.
"""

from __future__ import annotations

import time
from typing import Callable


class SaveSchedule:
    def __init__(self, checkpoint_cfg, rank: int, clock: Callable[[], float] = time.monotonic):
        self.every_steps = int(checkpoint_cfg.interval)
        self.every_s = float(checkpoint_cfg.interval_minutes) * 60
        self.rank = rank
        self.clock = clock
        self.since = clock()

    def restart_clock(self) -> None:
        """At the start of training and after every save (also one refused for a non-finite state: the next try
        is a whole interval later, not every step)."""
        self.since = self.clock()

    def time_vote(self) -> bool:
        """This rank's vote for a save by time: rank 0's clock; every other rank votes no."""
        return self.rank == 0 and self.every_s > 0 and self.clock() - self.since >= self.every_s

    def due(self, step: int, last_step: int, time_agreed: bool) -> bool:
        """Whether to save after `step`; `time_agreed` is the all-reduced time vote. The last step's checkpoint is
        saved after the loop (checkpoint.at_end), not here."""
        if step >= last_step:
            return False
        return bool(self.every_steps and step % self.every_steps == 0) or time_agreed
