"""The plan's calibration: the least-squares fit of efficiency and communication factor, the file tune writes, and
the plan's step time with the fitted factors."""

from __future__ import annotations

import json

import pytest

from llmtrain.plan import calibration


def points(efficiency: float, comm_factor: float, parts: list[tuple[float, float]]) -> list[dict]:
    return [{"key": f"p{i}", "compute_s": c, "comm_s": m, "measured_step_s": c / efficiency + comm_factor * m}
            for i, (c, m) in enumerate(parts)]


def test_the_fit_recovers_the_factors_that_made_the_measurements():
    found = calibration.fit(points(0.3, 2.5, [(1.0, 0.2), (2.0, 0.1), (0.5, 0.4), (1.5, 0.3)]))
    assert found == pytest.approx((0.3, 2.5), rel=1e-9)


def test_without_communication_to_see_only_the_efficiency_is_fitted():
    found = calibration.fit(points(0.04, 7.0, [(0.01, 1e-6), (0.02, 0.0), (0.015, 1e-7)]))
    assert found[1] == 1.0 and found[0] == pytest.approx(0.04, rel=1e-3)


def test_a_negative_communication_factor_becomes_zero_and_the_efficiency_is_refitted():
    # Steps that got faster as communication grew: no positive factor explains them.
    data = [{"key": "a", "compute_s": 1.0, "comm_s": 0.5, "measured_step_s": 2.0},
            {"key": "b", "compute_s": 1.0, "comm_s": 1.0, "measured_step_s": 1.8}]
    efficiency, comm = calibration.fit(data)
    assert comm == 0.0 and 1 / efficiency == pytest.approx((1 / 2.0 + 1 / 1.8) / (1 / 4 + 1 / 1.8**2))


def test_nothing_measured_fits_nothing():
    assert calibration.fit([]) is None
    assert calibration.fit([{"key": "x", "compute_s": 1.0, "comm_s": 0.0, "measured_step_s": 0.0}]) is None


def test_the_file_says_who_writes_it_and_a_remeasured_layout_replaces_its_point(tmp_path, monkeypatch):
    monkeypatch.setenv("LLMTRAIN_CACHE", str(tmp_path))
    first = calibration.record("h100", "gpt", points(0.5, 1.0, [(1.0, 0.1), (2.0, 0.3)]), today="2026-01-02")
    assert first.line() == "calibrated from 2 trials on h100, 2026-01-02"
    again = calibration.record("h100", "gpt", points(0.25, 1.0, [(1.0, 0.1)]), today="2026-01-03")
    data = json.loads((tmp_path / "calibration.json").read_text())
    assert list(data)[0] == "warning" and "do not edit by hand" in data["warning"]
    assert [p["key"] for p in data["entries"]["h100/gpt"]["points"]] == ["p1", "p0"]
    assert again.trials == 2 and calibration.lookup("h100", "gpt") == again
    assert calibration.lookup("h100", "llama") is None and calibration.lookup("a100", "gpt") is None


def test_an_unreadable_file_plans_uncalibrated(tmp_path, monkeypatch):
    monkeypatch.setenv("LLMTRAIN_CACHE", str(tmp_path))
    (tmp_path / "calibration.json").write_text("{not json")
    assert calibration.lookup("cpu", "gpt") is None


def test_the_plan_uses_the_fitted_factors(tmp_path, monkeypatch):
    from llmtrain.config import compose_config
    from llmtrain.plan.cli import plan_for

    monkeypatch.setenv("LLMTRAIN_CACHE", str(tmp_path))
    cfg = compose_config(["hardware=cpu", "+hardware.peak_tflops.float32=1.0", "hardware.memory_gib=64",
                          "cluster.nproc_per_node=2", "parallel.tp=2"])
    raw = plan_for(cfg, calibrated=False)
    compute, comm = raw.compute_s * raw.hardware["efficiency"], raw.exposed_comm_s
    assert raw.step_time_s == pytest.approx(compute / 0.5 + comm)
    calibration.record("cpu", "gpt", points(0.2, 3.0, [(1.0, 0.2), (2.0, 0.1), (0.5, 0.4)]), today="2026-02-03")
    tuned = plan_for(cfg)
    assert tuned.step_time_s == pytest.approx(compute / 0.2 + 3.0 * comm)
    assert tuned.notes[-1] == ("step time calibrated from 3 trials on cpu, 2026-02-03: matmuls at 20.0% of peak, "
                               "3.00x the exposed communication of the uncalibrated estimate")
    assert plan_for(cfg, calibrated=False).step_time_s == pytest.approx(raw.step_time_s)
