"""Where a launch's training ends, and the `nothing to do` line the launcher and the trainer say alike."""

from __future__ import annotations

from types import SimpleNamespace

from llmtrain.train.run_end import last_step, nothing_to_do


def _train(max_steps: int, stop_at_step: int | None = None):
    return SimpleNamespace(max_steps=max_steps, stop_at_step=stop_at_step)


def test_the_last_step_is_max_steps_or_an_earlier_stop():
    assert last_step(_train(300)) == 300
    assert last_step(_train(300, 100)) == 100
    assert last_step(_train(300, 500)) == 300


def test_nothing_to_do_only_at_or_past_the_last_step():
    assert nothing_to_do(299, _train(300)) is None
    assert nothing_to_do(300, _train(300)) == "llmtrain: nothing to do: already at step 300 (train.max_steps=300)"
    assert nothing_to_do(300, _train(200)) == "llmtrain: nothing to do: already at step 300 (train.max_steps=200)"
    assert nothing_to_do(10, _train(20, 10)) == ("llmtrain: nothing to do: already at step 10 (train.max_steps=20, "
                                                 "train.stop_at_step=10)")
    assert nothing_to_do(10, _train(20, 15)) is None
