"""The injected slowdown (LLMTRAIN_INJECT_SLOWDOWN) sleeps what its spec says, on the ranks it names."""

from __future__ import annotations

import pytest

from llmtrain.train import fault_injection


@pytest.fixture
def sleeps(monkeypatch):
    slept: list[float] = []
    monkeypatch.setattr(fault_injection.time, "sleep", slept.append)
    return slept


def hook(monkeypatch, spec: str, rank: int):
    monkeypatch.setenv(fault_injection.SLOWDOWN_ENV, spec)
    return fault_injection.compute_slowdown(rank)


def test_a_factor_sleeps_in_proportion_to_the_compute_from_its_step(monkeypatch, sleeps):
    assert hook(monkeypatch, "1:3:2", 0) is None
    slow = hook(monkeypatch, "1:3:2", 1)
    slow(1, 0.5)
    slow(2, 0.5)
    slow(3, 0.25)
    assert sleeps == [1.0, 0.5]


def test_a_fixed_sleep_on_every_rank_ignores_the_compute(monkeypatch, sleeps):
    for rank in (0, 3):
        slow = hook(monkeypatch, "*:0.2s:1", rank)
        slow(1, 0.01)
        slow(5, 3.0)
    assert sleeps == [0.2] * 4


def test_a_last_step_ends_the_slowdown(monkeypatch, sleeps):
    slow = hook(monkeypatch, "*:2s:1:3", 0)
    for step in range(1, 6):
        slow(step, 0.1)
    assert sleeps == [2.0] * 3


def test_without_the_variable_there_is_no_hook(monkeypatch):
    monkeypatch.delenv(fault_injection.SLOWDOWN_ENV, raising=False)
    assert fault_injection.compute_slowdown(0) is None
