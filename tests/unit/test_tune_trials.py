"""The tune's loop over trials without launching anything: the budget stops it before a trial that would end past
it, Ctrl-C keeps what was measured, a recorded trial is reused, and a trial's measurement skips the warm-up."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from llmtrain.tune import cli, trials


def fake_chosen(n: int):
    layouts = []
    for i in range(n):
        layout = SimpleNamespace(name=f"layout{i}", overrides=[f"parallel.zero={i}"], cfg=None, refines="")
        plan = SimpleNamespace(tokens_per_s=100.0, mfu=0.1, peak_bytes_per_rank=2**30)
        layouts.append(SimpleNamespace(layout=layout, plan=plan))
    return layouts


@pytest.fixture
def loop(tmp_path, monkeypatch):
    """cli._run_trials over three layouts whose trials take `wall` seconds each, or raise what `raises` holds."""
    launched, behaviour = [], {"wall": 0.0, "raises": {}}

    def run_trial(plan, run, number, trial, ranked, steps):
        if number in behaviour["raises"]:
            raise behaviour["raises"][number]
        launched.append(trial.layout)
        trial.wall_s, trial.tokens_per_s = behaviour["wall"], 50.0 + number
        return trial, None

    monkeypatch.setattr(trials, "run_trial", run_trial)
    monkeypatch.setattr(cli, "uncalibrated_parts", lambda cfg: SimpleNamespace(compute_s=1.0, exposed_comm_s=0.0))
    chosen = fake_chosen(3)
    plan = SimpleNamespace(dir=str(tmp_path), runs=[SimpleNamespace(dir=str(tmp_path / r.layout.name))
                                                    for r in chosen])

    def go(budget_min=None):
        args = SimpleNamespace(budget_min=budget_min, steps=5)
        return cli._run_trials(plan, chosen, args, cli.Budget(budget_min))

    return SimpleNamespace(go=go, launched=launched, behaviour=behaviour, dir=tmp_path)


def test_all_trials_run_and_are_written_as_they_end(loop):
    done, code, left = loop.go()
    assert (code, left, loop.launched) == (None, 0, ["layout0", "layout1", "layout2"])
    saved = json.loads((loop.dir / "trials" / "layout1.json").read_text())
    assert saved["tokens_per_s"] == 52.0 and saved["overrides"] == ["parallel.zero=1"]


def test_the_budget_starts_no_trial_that_would_end_past_it(loop, capsys):
    loop.behaviour["wall"] = 40.0  # each trial "took" 40 s: a second one would end past a one-minute budget
    done, code, left = loop.go(budget_min=1.0)
    assert (code, left, [t.layout for t in done]) == (None, 2, ["layout0"])
    assert "llmtrain: tune: budget of 1 min: not starting 2 trial(s) (each takes ~40 s)" in capsys.readouterr().out


def test_ctrl_c_keeps_the_trials_measured_before_it(loop):
    loop.behaviour["raises"] = {2: KeyboardInterrupt()}
    done, code, _ = loop.go()
    assert code == 130 and [t.layout for t in done] == ["layout0"]
    assert sorted(p.name for p in (loop.dir / "trials").iterdir()) == ["layout0.json"]


def test_a_recorded_trial_is_reused_without_a_launch(loop, capsys):
    loop.go()
    loop.launched.clear()
    done, code, _ = loop.go()
    assert loop.launched == [] and [t.tokens_per_s for t in done] == [51.0, 52.0, 53.0]
    assert capsys.readouterr().out.count("llmtrain: tune: reusing trial layout") == 3


def test_the_measurement_is_the_median_after_the_warm_up(tmp_path):
    rows = [{"step": 1, "tokens_per_s": 1.0, "mem_gib": 3.0},
            {"step": 2, "tokens_per_s": 10.0, "mfu": 0.1, "peak_tflops": 2.0},
            {"step": 3, "tokens_per_s": 30.0, "mfu": 0.3, "peak_tflops": 2.0},
            {"step": 4, "tokens_per_s": 20.0, "mfu": 0.2, "peak_tflops": 2.0}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    trial = trials.Trial("x", [], 1.0, 0.1, 1.0, 1.0, 0.0)
    trials.measure(trial, str(tmp_path), steps=4)
    assert (trial.tokens_per_s, trial.mfu, trial.peak_gib, trial.measured_steps) == (20.0, 0.2, 3.0, 3)
    assert trial.mfu_peak_tflops == 2.0 and trial.shown_mfu == 0.2
    empty = trials.Trial("y", [], 1.0, 0.1, 1.0, 1.0, 0.0)
    trials.measure(empty, str(tmp_path / "none"), steps=4)
    assert (empty.fit, empty.reason) == ("failed", "no step after the first 1 was logged")
