"""The goodput ledger of real launches on 2 CPU ranks: a rank that dies with launch.max_restarts=1 costs the work
since the last checkpoint (redone after the restart) and one restart; a clean run loses nothing."""

from __future__ import annotations

import json
import re
import statistics

import pytest
from conftest import SMALL, read_rows, run_cli

pytestmark = pytest.mark.slow
# Checkpoints at steps 4 and 8; rank 1 dies before step 11, so steps 9 and 10 are lost and redone.
BASE = SMALL + ["train.max_steps=14", "train.global_batch_size=8", "train.micro_batch_size=2",
                "checkpoint.interval=4"]
PARTS = ("productive_s", "queue_s", "startup_s", "checkpoint_s", "lost_s", "restart_s", "shutdown_s")


def _launch(run_dir, *overrides, env=None):
    result = run_cli(["launch", f"run.dir={run_dir}", *BASE, *overrides], env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return json.loads((run_dir / "goodput.json").read_text())["starts"]


@pytest.fixture(scope="module")
def failed_once(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("failed") / "run"
    starts = _launch(run_dir, "launch.max_restarts=1", env={"LLMTRAIN_INJECT_EXIT": "11:1"})
    return run_dir, starts


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("clean") / "run"
    return run_dir, _launch(run_dir)


def _step_seconds(run_dir) -> float:
    """The median training time of one step, from the kept rows' elapsed_s."""
    rows = sorted((r["step"], r["elapsed_s"]) for r in read_rows(run_dir) if "loss" in r)
    return statistics.median(b[1] - a[1] for a, b in zip(rows, rows[1:]) if b[0] == a[0] + 1)


def test_failure_loses_the_work_since_the_checkpoint(failed_once):
    run_dir, starts = failed_once
    assert len(starts) == 1
    entry = starts[0]
    assert entry["restarts"] == 1 and entry["requeues"] == 0 and entry["launch"] == 1
    # Two steps (9 and 10) ran after the checkpoint of step 8 and before the failure.
    expected = 2 * _step_seconds(run_dir)
    assert entry["lost_s"] > 0
    assert abs(entry["lost_s"] - expected) <= max(0.5 * expected, 0.3), (entry, expected)
    assert entry["restart_s"] > 0 and entry["checkpoint_s"] > 0 and entry["startup_s"] > 0
    assert 0 < entry["goodput"] < 1
    assert abs(sum(entry[k] for k in PARTS) - entry["allocated_s"]) <= 0.01, entry
    assert entry["goodput"] == pytest.approx(entry["productive_s"] / entry["allocated_s"], abs=1e-4)


def test_failure_in_status_and_report(failed_once):
    run_dir, starts = failed_once
    entry = starts[0]
    status = run_cli(["status", str(run_dir)])
    assert status.returncode == 0, status.stderr
    lines = status.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("goodput"))
    assert re.fullmatch(rf"goodput     {entry['goodput']:.1%} = productive {entry['productive_s']:.1f} s / "
                        rf"allocated {entry['allocated_s']:.1f} s \(1 start\(s\)\)", lines[at]), lines[at]
    assert [line.split(":")[0].strip() for line in lines[at + 1:at + 6]] == \
        ["queue", "start-up", "checkpoint saves", "lost work", "restarts"]
    assert lines[at + 4].startswith(f"  lost work:        {entry['lost_s']:.1f} s (")
    assert lines[at + 5].startswith("  restarts:         1 restart(s), 0 requeue(s): ")
    report = run_cli(["report", str(run_dir)])
    assert report.returncode == 0, report.stderr
    assert re.search(r"goodput +│ +\d+\.\d% = productive", report.stdout), report.stdout
    assert re.search(r"lost work +│ +\d+\.\d s \(\d+\.\d%\)", report.stdout), report.stdout


def test_clean_run_loses_nothing(clean):
    _, starts = clean
    entry = starts[0]
    assert entry["lost_s"] == 0 and entry["restarts"] == 0 and entry["restart_s"] == 0
    assert entry["queue_s"] == 0 and entry["checkpoint_s"] > 0  # saves at steps 4, 8, 12 and the end
    assert 0 < entry["goodput"] < 1
    assert abs(sum(entry[k] for k in PARTS) - entry["allocated_s"]) <= 0.01, entry


def test_a_second_launch_is_a_second_entry(clean):
    run_dir, _ = clean
    starts = _launch(run_dir, "train.max_steps=16")
    assert len(starts) == 2 and [s["launch"] for s in starts] == [1, 2]
    assert starts[1]["lost_s"] == 0 and starts[1]["productive_s"] > 0
