"""The tune's second round without launching anything: which switches of train.compile and optim.fused are tried
on the measured-fastest layout and which are left out (and why), the winner over both rounds in tuned.yaml and the
launch line, and a calibration that learns from layout trials only."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from llmtrain.tune import cli, refine, trials

BASE = ["hardware=cpu", "+hardware.peak_tflops.float32=0.05", "cluster.nproc_per_node=2", "data=synthetic"]


@pytest.fixture(scope="module")
def best(tmp_path_factory):
    """The plan's first layout of BASE, as the layout round's winner."""
    import os

    from llmtrain.config import compose_config
    from llmtrain.tune import candidates

    before = os.environ.get("LLMTRAIN_CACHE", "")
    os.environ["LLMTRAIN_CACHE"] = str(tmp_path_factory.mktemp("empty-cache"))
    try:
        return candidates.top(candidates.ranked(compose_config(BASE)), 1)[0]
    finally:
        os.environ["LLMTRAIN_CACHE"] = before


def test_on_the_cpu_compile_is_switched_on_and_the_plain_loop_becomes_the_fused_kernel(best):
    found, skipped = refine.variants(best, "cpu")
    assert skipped == []
    assert [r.layout.name for r in found] == [best.layout.name + "+compile", best.layout.name + "+fused"]
    compiled, fused = found
    assert compiled.layout.overrides == [*best.layout.overrides, "train.compile=true"]
    assert fused.layout.overrides == [*best.layout.overrides, "optim.fused=torch"]
    assert (compiled.layout.cfg.train.compile, compiled.layout.cfg.optim.fused) == (True, "auto")
    assert (fused.layout.cfg.train.compile, fused.layout.cfg.optim.fused) == (False, "torch")
    assert best.layout.cfg.train.compile is False and best.layout.cfg.optim.fused == "auto"  # not changed
    assert compiled.plan is best.plan and compiled.layout.refines == best.layout.name


def test_on_cuda_auto_is_already_fused_so_the_plain_loop_is_tried():
    cfg = SimpleNamespace(train=SimpleNamespace(compile=True), optim=SimpleNamespace(fused="auto"))
    assert refine.switched(cfg, "optim.fused", "cuda") == "none"
    assert refine.switched(cfg, "optim.fused", "cpu") == "torch"
    assert refine.switched(cfg, "train.compile", "cuda") is False
    cfg.optim.fused = "apex"
    assert refine.switched(cfg, "optim.fused", "cpu") == "none"
    assert refine.SUFFIXES[("train.compile", False)] == "+eager"
    assert refine.device_type("cpu") == "cpu" and refine.device_type("h100") == "cuda"


def test_a_switch_the_device_cannot_run_is_left_out_with_the_reason(best, monkeypatch):
    monkeypatch.setattr(refine.shutil, "which", lambda name: None)
    found, skipped = refine.variants(best, "cpu")
    assert [r.layout.name for r in found] == [best.layout.name + "+fused"]
    assert skipped == [f"not trying {best.layout.name} with train.compile=true: torch.compile on the CPU needs a "
                       "C++ compiler (g++, c++ or clang++), and none is on PATH"]


def test_a_switch_validate_refuses_is_left_out_with_its_key(best, monkeypatch):
    from llmtrain.config import ConfigError

    def refuse_fused(cfg):
        if cfg.optim.fused != "auto":
            raise ConfigError("optim.fused", "not with this layout")

    monkeypatch.setattr(refine, "validate", refuse_fused)
    found, skipped = refine.variants(best, "cpu")
    assert [r.layout.name for r in found] == [best.layout.name + "+compile"]
    assert skipped == [f"not trying {best.layout.name} with optim.fused=torch: refused: optim.fused: not with "
                       "this layout"]


@pytest.fixture
def tune(best, tmp_path, monkeypatch):
    """cli._refine and cli._finish around fake trials: `speeds` maps a trial's name to its tokens/s."""
    speeds, launched, learned = {}, [], []

    def run_trial(plan, run, number, trial, ranked, steps):
        launched.append((number, trial.layout))
        trial.tokens_per_s, trial.wall_s = speeds[trial.layout], 1.0
        return trial, None

    monkeypatch.setattr(trials, "run_trial", run_trial)
    monkeypatch.setattr(cli, "uncalibrated_parts", lambda cfg: SimpleNamespace(compute_s=1.0, exposed_comm_s=0.0))
    monkeypatch.setattr(cli, "learn", lambda cfg, profile, done: learned.extend(done))
    monkeypatch.setattr(cli.record, "write", lambda plan: None)
    layout_trial = trials.new_trial(best, SimpleNamespace(compute_s=1.0, exposed_comm_s=0.0))
    args = SimpleNamespace(overrides=["data=synthetic", "optim.fused=auto"], config_dir=[], steps=5, budget_min=None,
                           launch=False)
    plan = SimpleNamespace(dir=str(tmp_path), runs=[SimpleNamespace(dir=str(tmp_path / best.layout.name))])

    def go(layout_speed: float):
        layout_trial.tokens_per_s = layout_speed
        more, code, left = cli._refine(plan, [best], [layout_trial], args, cli.Budget(None), "cpu")
        assert (code, left) == (None, 0)
        done = [layout_trial, *more]
        exit_code = cli._finish(best.layout.cfg, args, str(tmp_path), done, None, 0, "cpu")
        return done, exit_code

    def refine_only(budget):
        layout_trial.tokens_per_s = 100.0
        return cli._refine(plan, [best], [layout_trial], args, budget, "cpu")

    return SimpleNamespace(go=go, refine_only=refine_only, speeds=speeds, launched=launched, learned=learned,
                           dir=tmp_path, plan=plan)


def test_the_refinement_trials_follow_the_layouts_and_the_fastest_of_all_wins(tune, best, capsys):
    name = best.layout.name
    tune.speeds.update({f"{name}+compile": 90.0, f"{name}+fused": 130.0})
    done, code = tune.go(layout_speed=100.0)
    assert code == 0 and tune.launched == [(2, f"{name}+compile"), (3, f"{name}+fused")]
    assert [t.refines for t in done] == ["", name, name]
    assert [t.estimated_tokens_per_s for t in done] == [best.plan.tokens_per_s] * 3
    saved = json.loads((tune.dir / "trials" / f"{name}+fused.json").read_text())
    assert saved["tokens_per_s"] == 130.0 and saved["overrides"][-1] == "optim.fused=torch"
    option = (tune.dir / "best" / "parallel" / "tuned.yaml").read_text()
    assert "optim:\n  fused: torch\n" in option and "  compile: false\n" in option
    out = capsys.readouterr().out
    assert f"llmtrain: tune: refining {name}: {name}+compile, {name}+fused\n" in out
    assert f"llmtrain: tune: fastest measured: {name}+fused (130 tokens/s" in out
    line = next(s for s in out.splitlines() if s.startswith("llmtrain: tune: launch it with: "))
    assert line.endswith("parallel=tuned data=synthetic")  # the given optim.fused would undo the tuned one
    assert [t.layout for t in tune.learned if not t.refines] == [name]  # what learn() is given


def test_when_no_refinement_is_faster_the_layout_wins_with_the_configured_values(tune, best, capsys):
    name = best.layout.name
    tune.speeds.update({f"{name}+compile": 90.0, f"{name}+fused": 100.0})  # a tie: the layout, ranked first
    tune.go(layout_speed=100.0)
    option = (tune.dir / "best" / "parallel" / "tuned.yaml").read_text()
    assert "  compile: false\n" in option and "  fused: auto\n" in option
    assert f"llmtrain: tune: fastest measured: {name} (100 tokens/s" in capsys.readouterr().out


def test_the_budget_and_ctrl_c_stop_the_refinement_trials_too(tune, best, monkeypatch, capsys):
    budget = cli.Budget(1.0)
    budget.walls.append(50.0)  # the layout trial "took" 50 s: another would end past one minute
    assert tune.refine_only(budget) == ([], None, 2) and tune.launched == []
    assert "llmtrain: tune: budget of 1 min: not starting 2 trial(s) (each takes ~50 s)" in capsys.readouterr().out

    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(trials, "run_trial", interrupted)
    assert tune.refine_only(cli.Budget(None)) == ([], 130, 0)
    assert not (tune.dir / "trials").exists()


def test_calibration_learns_from_the_layout_trials_only(monkeypatch):
    from llmtrain.tune import calibration

    recorded = []
    monkeypatch.setattr(calibration, "point", lambda cfg, t: t.layout)
    monkeypatch.setattr(calibration.calibration, "record", lambda profile, fam, points: recorded.append(points))
    monkeypatch.setattr(calibration.calibration, "family", lambda model: "gpt")
    layout = trials.Trial("a", [], 1.0, 0.1, 1.0, 1.0, 0.0, tokens_per_s=5.0)
    compiled = trials.Trial("a+compile", [], 1.0, 0.1, 1.0, 1.0, 0.0, tokens_per_s=9.0, refines="a")
    calibration.learn(SimpleNamespace(model=None), "cpu", [layout, compiled])
    assert recorded == [["a"]]
