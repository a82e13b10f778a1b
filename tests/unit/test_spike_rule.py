"""The loss-spike rule (window, sigma, metric, non-finite steps), the policy's action and its bound, the skip
arithmetic, the run directory's record of rollbacks, the trainer state's copy of it, the injected spike and the
keys' checks."""

from __future__ import annotations

import json
import math
import statistics

import pytest
import torch
from helpers.refusals import validate_refusal as refusal

from llmtrain.rundir.spike_record import add_rollback, merged, read_rollbacks, skip_past, summary
from llmtrain.train.spike_rule import Spike, SpikeRule, action, skipped_range

LOSSES = [5.0, 4.8, 4.9, 4.7]  # mean 4.85, std 0.1118


def filled(metric: str = "loss", sigma: float = 3.0) -> SpikeRule:
    rule = SpikeRule(metric, window=4, sigma=sigma)
    for step, v in enumerate(LOSSES, 1):
        assert rule.judge(step, v, 1.0, skipped=False) is None
    return rule


def test_no_verdict_before_the_window_is_full():
    rule = SpikeRule("loss", window=4, sigma=3.0)
    for step, v in enumerate([5.0, 4.8, 900.0], 1):  # 900 with 2 values behind it: no verdict yet
        assert rule.judge(step, v, 1.0, skipped=False) is None
    assert list(rule.values) == [5.0, 4.8, 900.0]


def test_a_value_over_mean_plus_sigma_std_is_a_spike_and_stays_out_of_the_window():
    rule = filled()
    mean, std = statistics.fmean(LOSSES), statistics.pstdev(LOSSES)
    limit = mean + 3 * std
    assert rule.judge(5, limit - 1e-9, 1.0, skipped=False) is None  # at the band's edge: not a spike
    rule = filled()
    spike = rule.judge(5, 6.0, 1.0, skipped=False)
    assert spike == Spike(5, "loss", 6.0, mean, std, 3.0, 4)
    assert spike.rule() == "loss 6 > mean 4.85 + 3 x std 0.1118 of the last 4 steps (train.spike.sigma=3)"
    assert list(rule.values) == LOSSES  # the spike did not widen the band
    assert rule.judge(6, 6.0, 1.0, skipped=False) is not None  # so the next one is judged by the same band
    assert rule.judge(6, 4.6, 1.0, skipped=False) is None and list(rule.values) == [4.8, 4.9, 4.7, 4.6]


def test_under_warn_a_spike_enters_the_window_so_a_lasting_rise_is_taken_in():
    rule = SpikeRule("loss", window=4, sigma=3.0, admit_spikes=True)
    for step, v in enumerate(LOSSES, 1):
        rule.judge(step, v, 1.0, skipped=False)
    said = [rule.judge(step, 6.0, 1.0, skipped=False) is not None for step in range(5, 12)]
    assert said == [True, False, False, False, False, False, False]  # 4.8 4.9 4.7 6: 6 < 5.1 + 3 x 0.524
    assert list(rule.values) == [6.0] * 4


def test_a_larger_sigma_lets_the_same_value_pass():
    assert filled(sigma=3.0).judge(5, 5.3, 1.0, skipped=False) is not None  # 5.3 > 4.85 + 0.335
    assert filled(sigma=5.0).judge(5, 5.3, 1.0, skipped=False) is None  # 5.3 < 4.85 + 0.559


def test_non_finite_and_skipped_steps_are_the_streak_counters_not_the_rules():
    rule = filled()
    for value, skipped in ((math.inf, False), (math.nan, False), (900.0, True)):
        assert rule.judge(5, value, 1.0, skipped=skipped) is None
    assert list(rule.values) == LOSSES


def test_the_metric_chooses_loss_or_grad_norm():
    rule = SpikeRule("grad_norm", window=2, sigma=2.0)
    assert rule.judge(1, 5.0, 1.0, False) is None and rule.judge(2, 5.0, 1.2, False) is None
    assert rule.judge(3, 500.0, 1.1, False) is None  # a loss spike, but the metric is grad_norm
    spike = rule.judge(4, 5.0, 9.0, False)
    assert (spike.metric, spike.value, spike.step) == ("grad_norm", 9.0, 4)
    assert spike.rule().startswith("grad_norm 9 > mean 1.15 + 2 x std 0.05 of the last 2 steps")


@pytest.mark.parametrize("policy, done, bound, todo", [
    ("stop", 0, 3, "stop"), ("warn", 5, 3, "warn"), ("rollback", 0, 3, "rollback"), ("rollback", 2, 3, "rollback"),
    ("rollback", 3, 3, "stop"), ("rollback", 0, 0, "stop")])
def test_a_rollback_past_the_bound_is_a_stop(policy, done, bound, todo):
    assert action(policy, done, bound) == todo


def test_the_skipped_range_runs_from_the_checkpoint_through_the_spike_and_the_margin():
    # Checkpoint at step 4 (32 samples, 8 a step), spike at step 7 (samples 48-55), 2 more steps: 32-71.
    assert skipped_range(32, 48, 8, 2) == (32, 72)
    assert skipped_range(32, 48, 8, 0) == (32, 56)  # the spike's own batch at least
    assert skipped_range(48, 48, 16, 10) == (48, 48 + 11 * 16)  # checkpoint right before the spike


def test_the_stream_moves_past_every_skipped_range_it_stands_in():
    first = {"start": 32, "end": 72}
    second = {"start": 32, "end": 120}  # a second rollback to the same checkpoint, later in the stream
    assert skip_past(32, [first]) == 72
    assert skip_past(31, [first]) == 31 and skip_past(72, [first]) == 72  # outside: unchanged
    assert skip_past(32, [second, first]) == 120 and skip_past(80, [first, second]) == 120
    assert merged([first], [dict(first, step=9), second]) == [first, second]  # one entry per range, first kept


def test_the_run_dir_record_round_trips_and_replaces_an_entry_for_the_same_range(tmp_path):
    assert read_rollbacks(str(tmp_path)) == []
    entry = {"step": 7, "checkpoint_step": 4, "start": 32, "end": 72, "metric": "loss", "value": 512.5}
    add_rollback(str(tmp_path), entry)
    add_rollback(str(tmp_path), dict(entry, value=600.0))
    add_rollback(str(tmp_path), {"step": 20, "checkpoint_step": 16, "start": 128, "end": 200})
    assert [e.get("value") for e in read_rollbacks(str(tmp_path))] == [600.0, None]
    assert json.loads((tmp_path / "spikes.json").read_text())["rollbacks"][0]["start"] == 32
    assert summary(entry) == "step 7 -> checkpoint step 4, samples 32-71 skipped (40)"
    (tmp_path / "spikes.json").write_text("{not json")
    assert read_rollbacks(str(tmp_path)) == []


def test_the_trainer_state_carries_the_skipped_ranges_only_once_there_are_some():
    from llmtrain.checkpoint.training_state import TrainingState
    from llmtrain.train.loss_scale import DynamicLossScaler

    state = TrainingState(DynamicLossScaler(1.0, 2.0, 0.5, 10, enabled=False))
    assert "skipped" not in state.state_dict()  # the keys every checkpoint has had
    assert json.loads(state.state_dict(skipped=True)["skipped"]) == []  # a load's template asks for them
    state.skipped = [{"step": 7, "checkpoint_step": 4, "start": 32, "end": 72}]
    saved = state.state_dict()
    other = TrainingState(DynamicLossScaler(1.0, 2.0, 0.5, 10, enabled=False))
    other.load_state_dict(saved)
    assert other.skipped == state.skipped
    other.load_state_dict(TrainingState(DynamicLossScaler(1.0, 2.0, 0.5, 10, enabled=False)).state_dict())
    assert other.skipped == []


def test_the_injected_spike_is_keyed_by_the_global_sample(monkeypatch):
    from llmtrain.train.fault_injection import SPIKE_ENV, loss_spike

    monkeypatch.delenv(SPIKE_ENV, raising=False)
    assert loss_spike() is None
    monkeypatch.setenv(SPIKE_ENV, "50:100")
    hook = loss_spike()
    p = torch.nn.Parameter(torch.ones(2))
    p.grad = torch.full((2,), 0.5)
    assert hook(40, 8, torch.tensor(2.0), [p]).item() == 2.0 and p.grad.tolist() == [0.5, 0.5]  # samples 40-47
    assert hook(48, 8, torch.tensor(2.0), [p]).item() == 200.0 and p.grad.tolist() == [50.0, 50.0]  # 48-55
    assert hook(72, 8, torch.tensor(2.0), [p]).item() == 2.0  # past a skip, the sample is never met again


@pytest.mark.parametrize("override, key, message", [
    ("train.spike.window=1", "train.spike.window", "must be >= 2 (got 1)"),
    ("train.spike.sigma=0", "train.spike.sigma", "must be > 0 or null (got 0.0)"),
    ("train.spike.margin_steps=-1", "train.spike.margin_steps", "must be >= 0 (got -1)"),
    ("train.spike.max_rollbacks=-2", "train.spike.max_rollbacks", "must be >= 0 (got -2)"),
    ("train.spike.policy=retry", "train.spike.policy", "must be one of stop, rollback, warn (got retry)"),
    ("train.spike.metric=lr", "train.spike.metric", "must be one of loss, grad_norm (got lr)"),
])
def test_bad_spike_keys_are_one_line_naming_the_key(override, key, message):
    assert refusal(override) == (key, message)


def test_the_defaults_judge_nothing():
    from llmtrain.config import compose_config

    spike = compose_config([]).train.spike
    assert (spike.policy, spike.metric, spike.window, spike.sigma, spike.margin_steps, spike.max_rollbacks) == (
        "stop", "loss", 50, None, 10, 3)


def test_the_report_marks_every_spike_step_on_the_loss_plot():
    from llmtrain.report.spike_marks import mark_spikes, marks

    rows = [{"step": 4, "loss": 4.8}, {"step": 4, "event": "rollback", "spike_step": 7, "start": 32, "end": 72},
            {"step": 9, "event": "spike", "metric": "loss", "value": 9.0}, {"step": 9, "loss": 9.0}]
    assert marks(rows) == [(7, "spike at step 7: rolled back to step 4"), (9, "spike at step 9 (warned)")]
    drawn = []

    class Axes:
        def axvline(self, x, **style):
            drawn.append((x, style.get("label")))

    assert mark_spikes(Axes(), rows) == 2
    assert drawn == [(7, "loss spike"), (9, None)]  # one legend entry
    assert marks([{"step": 3, "loss": 1.0}]) == []
