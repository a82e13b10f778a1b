"""Where a launch's training ends (train.max_steps, or train.stop_at_step before it), and the line said when a
resumed run is already there: by the trainer, and by the launcher before it starts any worker."""

from __future__ import annotations


def last_step(train_cfg) -> int:
    """The step this launch trains up to."""
    t = train_cfg
    return min(t.max_steps, t.stop_at_step) if t.stop_at_step else t.max_steps


def nothing_to_do(step: int, train_cfg) -> str | None:
    """The line for a run that starts at `step` with nothing left to train, else None."""
    t = train_cfg
    if step < last_step(t):
        return None
    return (f"llmtrain: nothing to do: already at step {step} (train.max_steps={t.max_steps}"
            + (f", train.stop_at_step={t.stop_at_step}" if t.stop_at_step else "") + ")")
