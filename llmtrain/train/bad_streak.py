"""What a run stopped by a streak of non-finite steps says about where to go back to."""

from __future__ import annotations


def last_good_state(last_good: tuple[str, int] | None, bad_since: int) -> str:
    """Which checkpoint to go back to after a bad streak that began at step `bad_since`. Skipped steps leave the
    weights as they were, so a checkpoint of the step right before the streak holds the very weights every step of
    it failed from."""
    if last_good is None:
        return "no checkpoint of this run was saved before these steps"
    path, step = last_good
    if step == bad_since - 1:
        return (f"the newest checkpoint {path} holds the weights all these steps failed from (a skipped step "
                "leaves them unchanged), so resume an earlier one")
    return f"the last good checkpoint is {path}"


class BadStreak(RuntimeError):
    """A streak of train.max_bad_steps non-finite steps: the run stops, unless train.spike.policy=rollback."""
