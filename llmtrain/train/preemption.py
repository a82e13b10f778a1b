"""Preemption: SIGTERM or SIGUSR1 asks for a checkpoint at the next step boundary, then a clean exit.

The handler only sets a flag; all ranks agree on it with one MAX all-reduce per step, so they checkpoint at the
same step even when the signal reached them at different times (or only some of them). The same all-reduce carries
rank 0's vote for a periodic save by time (save_schedule.py).
"""

from __future__ import annotations

import signal

import torch
import torch.distributed as dist


class Preempted(Exception):
    def __init__(self, step: int, saved: bool = True):
        # Not saved: the state was non-finite, and a checkpoint of it would poison every resume.
        super().__init__(f"preempted at step {step}; " + ("checkpoint saved" if saved else
                                                          "no checkpoint saved (non-finite state)"))
        self.step = step
        self.saved = saved


class PreemptionFlag:
    SIGNALS = (signal.SIGTERM, signal.SIGUSR1)

    def __init__(self):
        self.requested = False
        for sig in self.SIGNALS:
            signal.signal(sig, self._handle)

    def _handle(self, signum, frame) -> None:
        self.requested = True

    @classmethod
    def ignore_from_now(cls) -> None:
        """Once training is over (done, or stopped with its checkpoint) a notice has nothing left to save. Ignored
        from then on: Python's teardown gives a signal it handled its default action back, and a Slurm time-limit
        notice arriving in those seconds would kill a finished rank and fail the start."""
        for sig in cls.SIGNALS:
            signal.signal(sig, signal.SIG_IGN)

    def agreed(self, save_vote: bool = False) -> tuple[bool, bool]:
        """(preemption requested on any rank, a save voted for by any rank)."""
        flags = torch.tensor([int(self.requested), int(save_vote)], dtype=torch.int32)
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        preempt, save = flags.tolist()
        return bool(preempt), bool(save)
