"""The layouts a tune measures: ranked by the plan's estimate, the global batch kept, the top K among those that fit,
and the overrides the winner is launched with."""

from __future__ import annotations

import pytest

BASE = ["hardware=cpu", "+hardware.peak_tflops.float32=0.05", "cluster.nproc_per_node=2", "data=synthetic"]


@pytest.fixture(scope="module")
def ranking(tmp_path_factory):
    import os

    from llmtrain.config import compose_config
    from llmtrain.tune import candidates

    before = os.environ.get("LLMTRAIN_CACHE", "")
    os.environ["LLMTRAIN_CACHE"] = str(tmp_path_factory.mktemp("empty-cache"))  # uncalibrated
    try:
        cfg = compose_config([*BASE, "hardware.memory_gib=0.04"])
        return cfg, candidates.ranked(cfg)
    finally:
        os.environ["LLMTRAIN_CACHE"] = before


def test_layouts_are_ranked_fastest_estimate_first_with_ties_by_name(ranking):
    _, ranked = ranking
    keys = [(-r.plan.tokens_per_s, r.layout.name) for r in ranked]
    assert keys == sorted(keys) and len({r.layout.name for r in ranked}) == len(ranked) > 20


def test_every_layout_keeps_the_global_batch_and_the_devices(ranking):
    cfg, ranked = ranking
    for r in ranked:
        p = r.layout.cfg.parallel
        assert r.layout.cfg.train.global_batch_size == cfg.train.global_batch_size == 16
        assert p.dp * p.cp * p.tp * p.pp == 2 and r.plan.world_size == 2
    schedules = {(r.layout.cfg.parallel.pp_schedule, r.layout.cfg.parallel.virtual_stages) for r in ranked}
    assert ("interleaved_1f1b", 2) in schedules
    assert {r.layout.cfg.train.micro_batch_size for r in ranked} >= {4, 8, 16}


def test_the_top_k_are_the_fastest_that_fit(ranking):
    from llmtrain.tune.candidates import top

    _, ranked = ranking
    fitting = [r for r in ranked if r.plan.fits]
    assert 0 < len(fitting) < len(ranked)  # 0.04 GiB leaves some out
    assert [r.layout.name for r in top(ranked, 3)] == [r.layout.name for r in fitting[:3]]


def test_the_name_and_overrides_of_a_layout(ranking):
    _, ranked = ranking
    pipelined = next(r.layout for r in ranked if r.layout.cfg.parallel.virtual_stages == 2)
    assert pipelined.name.startswith("dp1-tp1-pp2-interleaved_1f1b-v2-zero")
    assert "parallel.pp_schedule=interleaved_1f1b" in pipelined.overrides
    assert "parallel.sequence_parallel=false" in pipelined.overrides


def test_the_winner_is_launched_without_the_layout_keys_the_tune_was_given():
    from llmtrain.tune.winner import launch_line, launch_overrides

    given = ["model=gpt-125m", "parallel.tp=2", "run.dir=/tmp/x", "train.micro_batch_size=4", "precision=bf16",
             "train.global_batch_size=64"]
    assert launch_overrides(given) == ["parallel=tuned", "model=gpt-125m", "precision=bf16"]
    assert launch_line("/abs/t", ["my configs"], given) == (
        "llmtrain launch --config-dir 'my configs' --config-dir /abs/t/best parallel=tuned model=gpt-125m "
        "precision=bf16")


def test_context_parallel_layouts_are_named_and_set_only_where_cp_is_above_one(ranking):
    _, ranked = ranking
    split = [r.layout for r in ranked if r.layout.cfg.parallel.cp == 2]
    assert split and all(lay.name.startswith("dp1-tp1-pp1-cp2-zero") for lay in split)
    assert all("parallel.cp=2" in lay.overrides and "parallel.dp=1" in lay.overrides for lay in split)
    whole = [r.layout for r in ranked if r.layout.cfg.parallel.cp == 1]
    assert whole and not any("cp" in lay.name or any(o.startswith("parallel.cp=") for o in lay.overrides)
                             for lay in whole)  # the names and overrides recorded trials had before cp
    assert {lay.values["train.micro_batch_size"] for lay in split} >= {4, 8, 16}
