"""A data mixture trained under dp=2 (ranks forked in-process, helpers.inprocess_run): the same as one process, its
sources reported, resumed with new weights."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import SMALL, read_rows
from helpers.inprocess_run import train_in_process as train
from helpers.token_shards import write_shards, write_tokens  # noqa: F401

from llmtrain.data.mixture import MixtureSchedule


MIX_RUN = [*SMALL, "data=mix", "train.global_batch_size=8", "train.micro_batch_size=2", "train.eval_interval=3",
           "train.eval_steps=1", "checkpoint.interval=3"]


@pytest.mark.slow
def test_mix_trains_the_same_under_dp2_reports_sources_and_resumes_with_new_weights(tmp_path):
    rng = np.random.default_rng(0)
    web = write_tokens(tmp_path / "web.bin", rng.integers(0, 256, 6000))
    # code: 1,425 train tokens, 22 windows of 64: it runs out after the resume and starts its epoch 1.
    code = write_shards(tmp_path / "code", [np.arange(600) % 256, (np.arange(900) * 7) % 256])
    sources = f"data.sources=[{{path: {web}, weight: 0.7}}, {{path: {code}, weight: 0.3}}]"
    one = train(tmp_path / "one", *MIX_RUN, sources, "train.max_steps=3", "cluster.nproc_per_node=1")
    two = train(tmp_path / "two", *MIX_RUN, sources, "train.max_steps=3", "cluster.nproc_per_node=2")
    losses = {r["step"]: r["loss"] for r in one if "loss" in r}
    assert sorted(losses) == [1, 2, 3]
    assert max(abs(r["loss"] - losses[r["step"]]) for r in two if "loss" in r) <= 1e-6
    # Exact per-source tokens: the schedule's counts times seq_len.
    schedule = MixtureSchedule.fresh({"web": 0.7, "code": 0.3})
    for row in (r for r in two if "loss" in r):
        assert row["source_tokens"] == {k: v * 64 for k, v in schedule.consumed(8 * row["step"]).items()}
        assert row["data_wait_ms"] >= 0
    (val,) = [r for r in two if "val_loss" in r]
    assert set(val["source_val_loss"]) == {"web", "code"}
    assert val["val_loss"] == pytest.approx(0.7 * val["source_val_loss"]["web"] + 0.3 * val["source_val_loss"]["code"])
    # Under pipeline parallelism, with a weight-0 source: evaluated, not drawn, not averaged into val_loss.
    math_src = write_tokens(tmp_path / "math.bin", rng.integers(0, 256, 3000))
    with_math = sources[:-1] + f", {{path: {math_src}, weight: 0}}]"
    pp = train(tmp_path / "pp", *MIX_RUN, with_math, "train.max_steps=3", "cluster.nproc_per_node=2",
                "parallel.pp=2")
    assert max(abs(r["loss"] - losses[r["step"]]) for r in pp if "loss" in r) <= 1e-5
    (pp_val,) = [r for r in pp if "val_loss" in r]
    assert set(pp_val["source_val_loss"]) == {"web", "code", "math"}
    assert abs(pp_val["val_loss"] - val["val_loss"]) <= 1e-5
    assert all(abs(pp_val["source_val_loss"][k] - val["source_val_loss"][k]) <= 1e-5 for k in ("web", "code"))
    assert [r["source_tokens"] for r in pp if "loss" in r][-1] == {**{k: v * 64 for k, v in
                                                                      schedule.consumed(24).items()}, "math": 0}
    meta = json.loads((tmp_path / "two" / "checkpoints" / "step-0000003" / "meta.json").read_text())
    assert meta["mixture"]["source_samples"] == schedule.consumed(24)

    # Resume the dp=2 run with other weights (and one process): counts continue from the saved ones.
    sources2 = f"data.sources=[{{path: {web}, weight: 0.2}}, {{path: {code}, weight: 0.8}}]"
    rows = train(tmp_path / "two", *MIX_RUN, sources2, "train.max_steps=6", "cluster.nproc_per_node=1")
    log = (tmp_path / "two" / "logs" / "rank0.log").read_text()
    assert "a new mixture segment starts at sample 24" in log
    resumed, _ = schedule.continued({"web": 0.2, "code": 0.8}, 24)
    for row in (r for r in rows if "loss" in r and r["step"] > 3):
        assert row["source_tokens"] == {k: v * 64 for k, v in resumed.consumed(8 * row["step"]).items()}
    wrap = next(step for step in range(4, 7) if resumed.consumed(8 * step)["code"] > 22)
    assert log.count("llmtrain: source code starts epoch") == 1
    assert f"llmtrain: source code starts epoch 1 at step {wrap}" in log
    final = [r for r in rows if "loss" in r][-1]
    assert final["step"] == 6
    assert final["source_tokens"]["code"] - 64 * schedule.consumed(24)["code"] == pytest.approx(0.8 * 24 * 64, abs=64)
    assert len(read_rows(tmp_path / "two")) == len(rows)
