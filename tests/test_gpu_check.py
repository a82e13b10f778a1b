"""scripts/gpu_check.sh without a GPU: its CPU dry mode runs every part's logic with tiny models."""

from __future__ import annotations

import importlib.util
import os
import subprocess

import pytest
from conftest import REPO


def titles() -> dict:
    spec = importlib.util.spec_from_file_location("gpu_check_parts", REPO / "scripts" / "gpu_check_parts.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.TITLES


def run_check(out, parts: str | None = None, timeout: float = 900) -> subprocess.CompletedProcess:
    env = dict(os.environ, **({"GPU_CHECK_PARTS": parts} if parts else {}))
    return subprocess.run(["bash", str(REPO / "scripts" / "gpu_check.sh"), "--cpu", str(out)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)


def rows(out) -> dict[str, list[str]]:
    """summary.md's rows by part title: [status, figures, log]."""
    table = {}
    for line in (out / "summary.md").read_text().splitlines()[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        table[cells[0]] = cells[1:]
    return table


def test_a_part_that_times_out_is_a_fail_row_with_its_log(tmp_path):
    out = tmp_path / "check"
    result = run_check(out, parts="smoke:0.1 fp8:30", timeout=120)
    assert result.returncode == 0, result.stderr
    table, t = rows(out), titles()
    assert set(table) == set(t.values())
    status, figures, log = table[t["smoke"]]
    assert status == "FAIL" and "timed out after 0.1 s" in figures and log == str(out / "logs" / "smoke.log")
    assert os.path.exists(log)
    assert table[t["fp8"]][0] == "SKIP"
    assert table[t["memory"]][0] == "NOT RUN"


@pytest.mark.slow
def test_dry_mode_runs_every_part_on_cpu(tmp_path):
    out = tmp_path / "check"
    result = run_check(out)
    assert result.returncode == 0, result.stderr
    assert (out / "summary.md").read_text() in result.stdout
    table, t = rows(out), titles()
    assert set(table) == set(t.values())
    skipped = {t["apex"], t["fp8"]}  # apex needs CUDA; fp8 is a placeholder
    for title, (status, figures, log) in table.items():
        assert status == ("SKIP" if title in skipped else "PASS"), (title, status, figures, open(log).read()[-3000:])
