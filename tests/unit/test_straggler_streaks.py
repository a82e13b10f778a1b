"""The straggler decision over series of per-rank compute times."""

from __future__ import annotations

import pytest

from llmtrain.train.straggler import Straggler, StragglerStreaks, lower_median


def test_lower_median_takes_the_healthy_rank_of_two():
    assert lower_median([1.0, 1.5]) == 1.0
    assert lower_median([3.0, 1.0, 2.0]) == 2.0
    assert lower_median([4.0, 1.0, 3.0, 2.0]) == 2.0


def test_named_after_the_configured_number_of_consecutive_intervals():
    streaks = StragglerStreaks(factor=1.2, intervals=3)
    assert streaks.observe([1.0, 1.0, 1.4, 1.0]) == []
    assert streaks.observe([1.0, 1.0, 1.5, 1.0]) == []
    named = streaks.observe([1.0, 1.0, 1.6, 1.0])
    assert named == [Straggler(rank=2, slowdown=pytest.approx(1.5), intervals=3)]
    # The streak starts over once named: silent for two more intervals, named again at the third.
    assert streaks.observe([1.0, 1.0, 1.5, 1.0]) == []
    assert streaks.observe([1.0, 1.0, 1.5, 1.0]) == []
    assert [s.rank for s in streaks.observe([1.0, 1.0, 1.5, 1.0])] == [2]


def test_a_healthy_interval_breaks_the_streak():
    streaks = StragglerStreaks(factor=1.2, intervals=2)
    assert streaks.observe([1.0, 1.3]) == []
    assert streaks.observe([1.0, 1.1]) == []  # within the factor
    assert streaks.observe([1.0, 1.3]) == []
    assert streaks.observe([1.0, 1.3]) == [Straggler(1, pytest.approx(1.3), 2)]


def test_at_the_factor_is_not_slow_and_equal_ranks_name_none():
    streaks = StragglerStreaks(factor=1.25, intervals=1)
    assert streaks.observe([1.0, 1.25]) == []
    assert streaks.observe([2.0, 2.0, 2.0]) == []
    assert streaks.observe([0.0, 0.0]) == []


def test_one_interval_threshold_names_at_once_and_several_ranks():
    streaks = StragglerStreaks(factor=1.2, intervals=1)
    named = streaks.observe([1.0, 2.0, 1.0, 3.0])
    assert [(s.rank, s.slowdown) for s in named] == [(1, 2.0), (3, 3.0)]
