"""`llmtrain plan`'s figures: a plan that does not fit names the smallest layout change that does (and still exits
1); its MFU is labelled as the estimate it is, assumed or calibrated by `llmtrain tune`."""

from __future__ import annotations

import datetime
import json

import pytest
from helpers.sweep_tables import table_rows

from llmtrain.cli import main
from llmtrain.config import compose_config
from llmtrain.plan import calibration, fit_change

# llama3-8b on 4 x 8 H100 in fp32, data parallel only: 911.54 GiB per rank.
LLAMA_4X8 = ["model=llama3-8b", "cluster.nnodes=4", "cluster.nproc_per_node=8", "hardware=h100",
             "train.global_batch_size=256", "train.micro_batch_size=8"]
FITS = [*LLAMA_4X8, "parallel.tp=4", "parallel.sequence_parallel=true", "recompute=full"]


@pytest.fixture(autouse=True)
def wide(monkeypatch, tmp_path):
    monkeypatch.setenv("COLUMNS", "250")
    monkeypatch.setenv("LLMTRAIN_CACHE", str(tmp_path / "cache"))  # no calibration but the test's own


def _row(out: str, label: str) -> str:
    return next(row[1] for row in table_rows(out) if row[0] == label)


def test_a_plan_that_does_not_fit_names_the_smallest_change_that_does(capsys):
    assert main(["plan", *LLAMA_4X8]) == 1
    out = capsys.readouterr().out
    assert _row(out, "fits") == "NO"
    change = ["parallel.zero=3", "recompute.mode=full"]
    assert out.splitlines()[-1] == (
        f"does not fit (851.87 GiB per rank > 80.0 GiB); the smallest change that fits: {' '.join(change)} "
        "(70.14 GiB per rank, est. 15,613 tokens/s); --suggest 32 80 ranks every layout that fits")
    assert main(["plan", *LLAMA_4X8, "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["fits_with"] == change
    assert main(["plan", *LLAMA_4X8, *change]) == 0  # the change, as named, fits
    out = capsys.readouterr().out
    assert (_row(out, "fits"), _row(out, "peak memory per rank")) == ("yes", "70.14 GiB (stage 0's rank)")


def test_a_change_names_what_follows_the_layout_and_keeps_the_batch():
    cfg = compose_config(LLAMA_4X8)
    same = cfg.copy()
    same.parallel.dp_shard = 5  # not a key the search varies: no change
    assert fit_change.overrides_of(cfg, same) == []
    changed = cfg.copy()
    changed.parallel.pp, changed.parallel.dp, changed.parallel.pp_schedule = 2, 16, "gpipe"
    assert fit_change.overrides_of(cfg, changed) == ["parallel.pp=2", "parallel.dp=16", "parallel.pp_schedule=gpipe",
                                                     "train.global_batch_size=256", "train.micro_batch_size=8"]
    zero = cfg.copy()
    zero.parallel.zero = 3
    assert fit_change.overrides_of(cfg, zero) == ["parallel.zero=3"]


def test_sequence_parallel_alone_is_the_smallest_change_when_it_fits(capsys):
    """tp=4 with full recompute needs 85.77 GiB without sequence parallel, 58.02 GiB with it."""
    assert main(["plan", *FITS[:-2], "recompute=full"]) == 1
    assert "the smallest change that fits: parallel.sequence_parallel=true (58.02 GiB per rank" in \
        capsys.readouterr().out.splitlines()[-1]


def test_the_estimated_mfu_says_it_is_assumed_or_calibrated(capsys):
    assert main(["plan", *FITS]) == 0
    assert _row(capsys.readouterr().out, "est. MFU") == \
        "~37% of 67.0 TFLOPS/device (assumes matmuls at 50% of peak)"
    calibration.record("h100", "llama", [{"key": "k", "compute_s": 1.0, "comm_s": 0.0, "measured_step_s": 2.5}])
    assert main(["plan", *FITS]) == 0
    today = datetime.date.today().isoformat()
    assert _row(capsys.readouterr().out, "est. MFU").endswith(
        f"TFLOPS/device (calibrated from 1 trials on h100, {today}: matmuls at 40.0% of peak)")


def test_suggest_labels_its_estimates(capsys):
    assert main(["plan", *LLAMA_4X8, "--suggest", "32", "80"]) == 0
    out = capsys.readouterr().out
    assert table_rows(out)[0][-2:] == ["20,799", "~50%"]
    assert out.splitlines()[-1] == "estimates: assumes matmuls at 50% of peak"
