"""scripts/gpu_check_plan.py: the GPU check's parts, limits, groups and deadlines fit a 15-minute loan, and `plan`
prints what gpu_check.sh runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))

import gpu_check_plan as m  # noqa: E402


def plan_output(*args: str) -> list[str]:
    return subprocess.run([sys.executable, str(REPO / "scripts" / "gpu_check_parts.py"), "plan", *args],
                          capture_output=True, text=True, check=True).stdout.splitlines()


def test_the_default_parts_finish_within_6_minutes_and_each_of_three_long_groups_within_8():
    deadline, chosen = m.plan(None, None, None, "cuda")
    assert (deadline, chosen) == (360, [("throughput", 170), ("memory", 60), ("resume", 110)])
    assert sum(limit for _, limit in chosen) <= deadline <= 6 * 60
    assert list(m.GROUPS) == [1, 2, 3]
    for group in m.GROUPS:
        deadline, chosen = m.plan(None, group, None, "cuda")
        assert sum(limit for _, limit in chosen) <= deadline == 8 * 60, group
    # Every part is somewhere: the default run, a group, or only --parts.
    placed = [*m.DEFAULT_PARTS, *m.GROUPS[1], *m.GROUPS[2], *m.GROUPS[3], *m.PARTS_ONLY]
    assert sorted(placed) == sorted(m.LIMITS)


def test_limits_are_1_3_to_1_5_times_the_measured_times():
    measured = {p: lim for p, lim in m.LIMITS.items() if lim.measured is not None}
    assert set(measured) == {"plain", "memory", "resume"}
    for limit in [*measured.values(), m.DEFAULTS_RUN]:
        assert 1.3 <= limit.seconds / limit.measured <= 1.5, limit
    assert m.LIMITS["throughput"].seconds + m.DEFAULTS_RUN.seconds > 110  # it did not finish in 110 s


def test_the_first_part_that_needs_the_defaults_run_gets_its_limit_too():
    assert m.plan("memory", None, None, "cuda")[1] == [("memory", 60 + 70)]
    assert m.plan("throughput memory,tune", None, None, "cuda")[1] == [("throughput", 170), ("memory", 60),
                                                                        ("tune", 150)]
    assert m.plan(None, 2, None, "cuda")[1] == [("plain", 120), ("tune", 150), ("moe", 150), ("smoke", 40)]


def test_named_parts_cpu_factor_and_bad_input():
    assert m.plan("fp8,smoke:5", None, None, "cpu") == (180 * 3 + 5 + 20 * 3, [("fp8", 540), ("smoke", 5.0)])
    assert m.plan(None, 1, 100, "cpu")[0] == 100
    with pytest.raises(SystemExit, match="unknown part 'fp9' in --parts"):
        m.plan("fp9", None, None, "cuda")
    with pytest.raises(SystemExit, match="--parts smoke:x: the time limit must be seconds"):
        m.plan("smoke:x", None, None, "cuda")
    with pytest.raises(SystemExit, match="--long 4: the groups are 1, 2, 3"):
        m.parse_group("4")
    assert (m.parse_group(None), m.parse_group(""), m.parse_group("2"), m.parse_group("3")) == (1, 1, 2, 3)


def test_where_a_part_runs():
    assert [m.where_run(p) for p in ("memory", "llama", "tune", "step", "fp8")] == \
        ["the default run", "--long 1", "--long 2", "--long 3", "--parts fp8"]


def test_plan_prints_what_the_shell_reads_and_a_table_with_measured_and_estimated_limits():
    assert plan_output("--shell") == ["360", "throughput:170 memory:60 resume:110"]
    assert plan_output("--shell", "--long") == ["480", "llama:330 long:75 fp16:50"]
    assert plan_output("--shell", "--long=2", "--device", "cpu") == ["1440", "plain:360 tune:450 moe:450 smoke:120"]
    assert plan_output("--shell", "--long", "3") == ["480", "step:450"]
    lines = plan_output()
    assert lines[0] == "default parts (one H200): deadline 360 s from the check's start; limits add up to 340 s"
    assert lines[2:] == ["  memory         60 s  measured 41 s", "  resume        110 s  measured 80 s"]
    assert lines[1].startswith("  throughput    170 s  (estimate) its compiled micro-8 run") and \
        lines[1].endswith("with the gpt-1.3b defaults run (measured 51 s, limit 70 s)")
    both = plan_output("--long")
    titles = [line for line in both if not line.startswith("  ")]
    assert titles == ["--long 1 (one H200): deadline 480 s from the check's start; limits add up to 455 s",
                      "--long 2 (one H200): deadline 480 s from the check's start; limits add up to 460 s",
                      "--long 3 (one H200): deadline 480 s from the check's start; limits add up to 450 s",
                      "only with --parts: fp8 async_save apex"]
    assert "  step          450 s  (estimate) five compiled llama3-1b launches of 12 steps, four without " \
           "liger_kernel; llama's two of 15 steps took 156 s" in both
    assert "  llama         330 s  (estimate) three compiled launches of 30 steps; two of 15 steps took 156 s" in both
    group2 = plan_output("--long", "2")
    assert group2[0].startswith("--long 2 (one H200)") and [line.split()[0] for line in group2[1:5]] == \
        ["plain", "tune", "moe", "smoke"] and group2[5:] == ["only with --parts: fp8 async_save apex"]
