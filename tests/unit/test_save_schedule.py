"""Periodic checkpoints by training time (checkpoint.interval_minutes, on by default) and by steps, decided the same
on every rank: rank 0's clock votes, the other ranks' clocks never do."""

from __future__ import annotations

import pytest
import torch.distributed as dist
from omegaconf import OmegaConf

from llmtrain.config import compose_config
from llmtrain.train.preemption import PreemptionFlag
from llmtrain.train.save_schedule import SaveSchedule


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_default_saves_every_30_minutes_of_training_time_by_rank_0s_clock():
    cfg = compose_config([])
    assert cfg.checkpoint.interval == 0 and cfg.checkpoint.interval_minutes == 30
    clock = FakeClock()
    rank0, rank1 = SaveSchedule(cfg.checkpoint, 0, clock), SaveSchedule(cfg.checkpoint, 1, clock)
    clock.now += 30 * 60 - 1
    assert not rank0.time_vote()
    clock.now += 1
    assert rank0.time_vote() and not rank1.time_vote()  # only rank 0's clock votes
    assert rank0.due(7, 300, time_agreed=True) and rank1.due(7, 300, time_agreed=True)
    assert not rank0.due(300, 300, time_agreed=True)  # the last step's checkpoint is at_end's
    rank0.restart_clock()  # a save (or a refused one) starts the next interval
    assert not rank0.time_vote()
    assert not any(rank0.due(step, 300, time_agreed=False) for step in range(1, 300))  # no step interval by default


def test_step_interval_and_time_interval_both_apply_and_zero_turns_time_off():
    clock = FakeClock()
    both = SaveSchedule(OmegaConf.create({"interval": 50, "interval_minutes": 0.01}), 0, clock)
    assert [s for s in range(1, 200) if both.due(s, 200, time_agreed=False)] == [50, 100, 150]
    clock.now += 0.6
    assert both.time_vote()
    steps_only = SaveSchedule(OmegaConf.create({"interval": 50, "interval_minutes": 0}), 0, clock)
    clock.now += 10**6
    assert not steps_only.time_vote()


def test_the_save_vote_rides_on_the_preemption_all_reduce(one_rank):
    flag = PreemptionFlag()
    assert flag.agreed() == (False, False)
    assert flag.agreed(save_vote=True) == (False, True)
    flag.requested = True
    assert flag.agreed(save_vote=False) == (True, False)
    assert dist.get_world_size() == 1


def test_negative_interval_minutes_is_refused_naming_the_key():
    from llmtrain.config import ConfigError
    from llmtrain.launch.config_probes import validate_here

    with pytest.raises(ConfigError) as e:
        validate_here(compose_config(["checkpoint.interval_minutes=-1"]))
    assert e.value.key == "checkpoint.interval_minutes" and "must be >= 0 (got -1.0)" in str(e.value)
