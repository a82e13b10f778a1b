"""When a running job counts as hung: no step completed on some rank within max(launch.hang_timeout_s, 10 x the
median step time), or a rank recorded a collective timeout (launch.pg_timeout_s). Before the first step of an
attempt only the rendezvous and process-group timeouts apply: start-up (data, compile, a resume) has no step time
to compare with.

Progress is what the launcher saw change, on its own clock, in each rank's RUN_DIR/logs/rank{R}.progress, so the
nodes' clocks need not agree."""

from __future__ import annotations

import re
import time

from llmtrain.launch.supervision.failures import rank_statuses
from llmtrain.rundir import rank_files
from llmtrain.rundir.hang_files import progress_path, read_json

STEP_TIME_FACTOR = 10
_TIMEOUT = re.compile(r"timed? ?out|timeout|timing out", re.IGNORECASE)


class HangWatch:
    def __init__(self, run_dir: str, world_size: int, timeout_s: float):
        self.run_dir, self.world_size, self.timeout_s = run_dir, world_size, timeout_s
        self.started = time.time()
        self.restart = 0
        self.seen: dict[int, tuple[int, int, int]] = {}  # rank -> (restart, steps, beats) last seen
        self.changed: dict[int, float] = {}  # rank -> time.monotonic() when that changed
        self.armed_at: float | None = None  # the first step of this attempt, seen by the launcher
        self.median_step_s = 0.0
        self.reported_timeout = False

    def bound_s(self) -> float:
        return max(self.timeout_s, STEP_TIME_FACTOR * self.median_step_s)

    def poll(self) -> str | None:
        """Why the job counts as hung now, or None."""
        return self._timed_out() or self._stalled()

    def _stalled(self) -> str | None:
        now = time.monotonic()
        beats = {r: read_json(progress_path(self.run_dir, r)) for r in range(self.world_size)}
        beats = {r: b for r, b in beats.items() if b is not None}
        newest = max((b.get("restart", 0) for b in beats.values()), default=0)
        if newest > self.restart:  # torchrun restarted the workers: a new attempt, with a new start-up
            self.restart, self.seen, self.changed, self.armed_at = newest, {}, {}, None
        for rank, beat in beats.items():
            key = (beat.get("restart", 0), beat.get("steps", 0), beat.get("beats", 0))
            if key[0] == self.restart and key[1] > 0 and self.seen.get(rank) != key:
                self.seen[rank], self.changed[rank] = key, now
                self.armed_at = self.armed_at or now
                self.median_step_s = max(self.median_step_s, float(beat.get("median_step_s") or 0.0))
        if self.armed_at is None:
            return None
        finished = self._finished()
        in_phase = {r for r, b in beats.items() if b.get("phase")}  # an eval or a save: not timed by step time
        quiet = {r: now - self.changed.get(r, self.armed_at) for r in range(self.world_size)
                 if r not in finished and r not in in_phase}
        stalled = [r for r, s in quiet.items() if s > self.bound_s()]
        if not stalled:
            return None
        steps = ", ".join(f"rank {r} at step {self._step(beats.get(r))}" for r in stalled[:4])
        return (f"no step completed for {max(quiet.values()):.0f} s ({steps}); the bound is "
                f"max(launch.hang_timeout_s={self.timeout_s:g}, {STEP_TIME_FACTOR} x median step "
                f"{self.median_step_s:.2f} s) = {self.bound_s():.0f} s")

    def _fresh_statuses(self) -> dict[int, dict]:
        """The statuses written by this launch's ranks (not an earlier launch's)."""
        return {rank: status for rank, status in sorted(rank_statuses(self.run_dir).items())
                if (rank_files.status_written_at(self.run_dir, rank) or 0.0) >= self.started}

    def _finished(self) -> set[int]:
        return {rank for rank, status in self._fresh_statuses().items() if status.get("status") in ("ok", "preempted")}

    def _timed_out(self) -> str | None:
        """A fresh status whose error is a collective timeout, once."""
        if self.reported_timeout:
            return None
        for rank, status in self._fresh_statuses().items():
            if status.get("status") == "error" and _TIMEOUT.search(status.get("error") or ""):
                self.reported_timeout = True
                return f"rank {rank} timed out in a collective (launch.pg_timeout_s)"
        return None

    @staticmethod
    def _step(beat: dict | None) -> str:
        return str(beat.get("step")) if beat else "none yet"
