"""lr_at: linear warmup to train.lr, then cosine decay to train.min_lr at train.max_steps."""

import math
from types import SimpleNamespace

import pytest

from llmtrain.train.optim import lr_at


def cfg(lr=1.0, min_lr=0.1, warmup_steps=10, max_steps=110):
    return SimpleNamespace(lr=lr, min_lr=min_lr, warmup_steps=warmup_steps, max_steps=max_steps)


def test_warmup_is_linear_and_reaches_lr_on_its_last_step():
    c = cfg()
    assert [lr_at(s, c) for s in range(10)] == pytest.approx([(s + 1) / 10 for s in range(10)])


def test_cosine_decay_from_lr_to_min_lr():
    c = cfg()
    assert lr_at(10, c) == pytest.approx(1.0)
    assert lr_at(60, c) == pytest.approx(0.1 + 0.45 * (1 + math.cos(math.pi * 0.5)))  # half way: the mean
    assert lr_at(110, c) == pytest.approx(0.1)


def test_steps_past_max_steps_stay_at_min_lr():
    assert lr_at(500, cfg()) == pytest.approx(0.1)


def test_no_warmup_starts_at_lr():
    assert lr_at(0, cfg(warmup_steps=0)) == pytest.approx(1.0)


def test_warmup_as_long_as_the_run_keeps_lr_after_it():
    c = cfg(warmup_steps=20, max_steps=20)
    assert lr_at(19, c) == pytest.approx(1.0)
    assert lr_at(25, c) == pytest.approx(1.0)


def test_decay_is_monotonic():
    c = cfg()
    values = [lr_at(s, c) for s in range(10, 111)]
    assert all(a >= b for a, b in zip(values, values[1:]))
