"""`llmtrain plan`'s CUDA peak from the real binary."""

from __future__ import annotations

import json

import pytest
from conftest import run_cli
from helpers.plan_points import MODEL, planned, POINTS  # noqa: F401


def test_cli_reports_the_same_peak():
    overrides, peak_gib, _ = POINTS["micro 4"]
    result = run_cli(["plan", *MODEL, *overrides, "--json"])
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["peak_bytes_per_rank"] == pytest.approx(planned(MODEL + overrides).peak_bytes_per_rank)
