"""Straggler detection on 2 CPU ranks (gloo): one rank slowed on purpose is named with its host and a slowdown
near the injected one, in the log, the metrics row, `status` and `report`; a healthy run names none."""

from __future__ import annotations

import re

import pytest
from conftest import SMALL, read_rows, run_cli

pytestmark = pytest.mark.slow
# The runs compare ranks' step times: the first test, which starts both runs, runs alone; the others read what they
# left.
measures_step_times = pytest.mark.exclusive
# Two steps per log interval (rows at steps 1, 2, 4, ...; the first interval is not judged), named after three slow
# intervals in a row: from step 3 on, rank 1 is slow in the intervals ending at steps 4, 6 and 8, so it is first
# named on the row of step 8.
BASE = SMALL + ["train.max_steps=16", "train.global_batch_size=8", "train.micro_batch_size=2",
                "train.log_interval=2"]
TOLERANCE = 0.35  # of the injected slowdown: the other jobs on a shared 2-core machine move both ranks' times
INJECTED = 2.0


def _launch(run_dir, *overrides, env=None):
    result = run_cli(["launch", f"run.dir={run_dir}", *BASE, *overrides], env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout


@pytest.fixture(scope="module")
def slowed(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("slowed") / "run"
    out = _launch(run_dir, env={"LLMTRAIN_INJECT_SLOWDOWN": f"1:{INJECTED}:3"})
    return run_dir, out


@pytest.fixture(scope="module")
def healthy(tmp_path_factory):
    # Factor 1.5: on a shared 2-core machine a healthy rank is now and then 1.2x slower than its peer for a few
    # intervals; the injected 2x stands well clear of either.
    run_dir = tmp_path_factory.mktemp("healthy") / "run"
    return run_dir, _launch(run_dir, "launch.straggler_factor=1.5")


@measures_step_times
def test_slowed_rank_is_named_in_the_log_with_host_and_slowdown(slowed, healthy):
    _, out = slowed
    lines = [line for line in out.splitlines() if "straggler" in line]
    assert lines, out[-3000:]
    for line in lines:
        m = re.fullmatch(r"llmtrain: straggler: rank 1 \(host (\S+), local rank 1\) (\d+\.\d\d)x the median "
                         r"compute time for 3 intervals", line)
        assert m, line
        assert INJECTED * (1 - TOLERANCE) <= float(m.group(2)) <= INJECTED * (1 + TOLERANCE), line


def test_slowed_rank_is_in_the_metrics_rows(slowed):
    run_dir, _ = slowed
    named = [r for r in read_rows(run_dir) if "stragglers" in r]
    # First at step 8 (intervals 3-4, 5-6, 7-8), or at 6 when noise made rank 1 slow in the one-step interval
    # of step 2 as well; never before three intervals were judged.
    assert named and named[0]["step"] in (6, 8), [(r["step"], r["stragglers"]) for r in named]
    for row in named:
        assert [s["rank"] for s in row["stragglers"]] == [1]
        assert isinstance(row["stragglers"][0]["host"], str) and row["stragglers"][0]["host"]
        assert INJECTED * (1 - TOLERANCE) <= row["stragglers"][0]["slowdown"] <= INJECTED * (1 + TOLERANCE)
    assert all(r["step"] >= 6 for r in named)


def test_status_and_report_name_the_straggler(slowed):
    run_dir, _ = slowed
    last = [r for r in read_rows(run_dir) if "stragglers" in r][-1]
    status = run_cli(["status", str(run_dir)])
    assert status.returncode == 0, status.stderr
    line = next(x for x in status.stdout.splitlines() if x.startswith("stragglers"))
    assert re.fullmatch(rf"stragglers  rank 1 \(host \S+\) {last['stragglers'][0]['slowdown']:.2f}x the median "
                        rf"compute time, named at step {last['step']}", line), line
    report = run_cli(["report", str(run_dir)])
    assert report.returncode == 0, report.stderr
    assert re.search(r"stragglers +│ rank 1 \(host \S+\) \d\.\d\dx the median compute time, named at step "
                     rf"{last['step']} \(\d+ time\(s\) in all\)", report.stdout), report.stdout


def test_healthy_run_names_none(healthy):
    run_dir, out = healthy
    assert "straggler" not in out
    rows = read_rows(run_dir)
    assert [r["step"] for r in rows if "loss" in r] == [1, 2, 4, 6, 8, 10, 12, 14, 16]
    assert not any("stragglers" in r for r in rows)
    status = run_cli(["status", str(run_dir)])
    assert status.returncode == 0 and "stragglers" not in status.stdout
