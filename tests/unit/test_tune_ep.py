"""`llmtrain tune` measures expert parallel too: a mixture of experts' layouts set `parallel.ep` (in their overrides
and their names); a dense model's layouts are named and overridden as before."""

from __future__ import annotations

import pytest

BASE = ["hardware=cpu", "+hardware.peak_tflops.float32=0.05", "cluster.nproc_per_node=2", "data=synthetic"]


def _ranked(tmp_path, monkeypatch, *overrides):
    from llmtrain.config import compose_config
    from llmtrain.tune import candidates

    monkeypatch.setenv("LLMTRAIN_CACHE", str(tmp_path / "cache"))  # uncalibrated
    return candidates.ranked(compose_config([*BASE, *overrides]))


def test_a_moe_models_layouts_set_ep(tmp_path, monkeypatch):
    ranked = _ranked(tmp_path, monkeypatch, "model=moe-tiny")
    eps = {}
    for r in ranked:
        layout = r.layout
        ep = layout.cfg.parallel.ep
        assert [o for o in layout.overrides if o.startswith("parallel.ep=")] == [f"parallel.ep={ep}"]
        assert f"-ep{ep}-" in layout.name and r.plan.dims["ep"] == ep
        eps.setdefault(ep, set()).add(layout.cfg.parallel.dp)
    # ep=2 wherever dp=2 (tp 1, pp 1) holds 2 ranks to split the 8 experts over; ep=1 everywhere
    assert eps == {1: {1, 2}, 2: {2}}
    split = next(r.layout for r in ranked if r.layout.cfg.parallel.ep == 2)
    assert split.name.startswith("dp2-tp1-pp1-ep2-zero")
    assert any(r.plan.all_to_all_bytes_per_step > 0 for r in ranked if r.layout.cfg.parallel.ep == 2)


def test_a_dense_models_layouts_do_not_name_ep(tmp_path, monkeypatch):
    ranked = _ranked(tmp_path, monkeypatch)
    assert len(ranked) > 20
    for r in ranked:
        assert not any(part.startswith("ep") for part in r.layout.name.split("-")), r.layout.name
        assert not any(o.startswith("parallel.ep") for o in r.layout.overrides), r.layout.overrides


@pytest.mark.parametrize("given", [["parallel.ep=2"], []])
def test_the_winner_sets_ep_and_drops_the_one_the_tune_was_given(tmp_path, given):
    from llmtrain.tune.winner import launch_overrides, write

    assert launch_overrides(["model=moe-tiny", *given]) == ["parallel=tuned", "model=moe-tiny"]
    path = write(str(tmp_path), ["parallel.dp=2", "parallel.ep=2", "parallel.zero=2"], 16, "llmtrain launch", "x")
    with open(path) as f:
        assert "parallel:\n  dp: 2\n  ep: 2\n  zero: 2\n" in f.read()
