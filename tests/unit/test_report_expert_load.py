"""`llmtrain report` of a mixture-of-experts run: the expert-load heat map's data (balanced against collapsed
routers), the PNG, the router losses beside the loss, the summary lines, the expert-parallel ranks' load; and
nothing of it for a dense run."""

from __future__ import annotations

import argparse
import json

import math

import pytest

from llmtrain.report.expert_load import _edges, load_maps, load_vs_even, rank_counts, row_ep, summary_rows
from llmtrain.report.run_report import add_report_arguments, run_report

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
LAYERS = [1, 3]  # sparse layers of a 4-layer model: layer 0 dense, sparse_every 2
E = 4  # experts


def _rows(steps: int, routed, ep: int = 1) -> list[dict]:
    """Train rows of steps 1..steps, logged every step; routed(step) -> expert_tokens of that step (None: a dense
    run, no MoE keys); ep > 1 adds the expert-parallel fields as the trainer logs them."""
    rows = []
    for step in range(1, steps + 1):
        row = {"step": step, "loss": 5.0 - 0.1 * step, "lr": 1e-3, "tokens_per_s": 1000.0, "tokens": 256 * step}
        tokens = routed(step)
        if tokens is not None:
            loads = [max(load_vs_even(t)) for t in tokens]
            row.update(aux_loss=1.0 + 0.01 * step, router_z_loss=2.0, moe_layers=LAYERS, expert_load=loads,
                       experts_idle=[t.count(0) for t in tokens], expert_tokens=tokens)
            if ep > 1:
                ranks = [rank_counts(t, ep) for t in tokens]
                row.update(ep_tokens=ranks, ep_load=[max(load_vs_even(r)) for r in ranks])
        rows.append(row)
    return rows


def balanced(step):
    return [[64, 64, 64, 64], [64, 64, 64, 64]]


def collapsing(step):
    """Layer 1 stays balanced; layer 3 drifts onto expert 2: even for steps 1-4, all of it from step 5 on."""
    return [[64, 64, 64, 64], [64, 64, 64, 64] if step <= 4 else [0, 0, 256, 0]]


def test_a_balanced_router_is_even_in_every_quarter():
    maps = load_maps(_rows(8, balanced))
    assert maps.layers == LAYERS and maps.n_experts == E
    assert [(p.first_step, p.last_step) for p in maps.panels] == [(1, 2), (3, 4), (5, 6), (7, 8)]
    for panel in maps.panels:
        assert panel.load == [[1.0] * E, [1.0] * E]
    assert maps.steps == list(range(1, 9)) and maps.busiest == [[1.0] * 8, [1.0] * 8]
    # The colour scale's top: the most one expert can get, each token going to top_k different experts.
    assert maps.ceiling == 4.0 and load_maps(_rows(8, balanced), top_k=2).ceiling == 2.0


def test_a_collapsing_router_shows_one_expert_taking_the_layer():
    maps = load_maps(_rows(10, collapsing))
    # 10 rows in four quarters: 3, 3, 2, 2 rows
    assert [(p.first_step, p.last_step) for p in maps.panels] == [(1, 3), (4, 6), (7, 8), (9, 10)]
    assert maps.panels[0].load == [[1.0] * E, [1.0] * E]
    # steps 4-6: 64 + 2 x 0 tokens per other expert, 64 + 2 x 256 to expert 2, of 768: shares x 4
    assert maps.panels[1].load[0] == [1.0] * E
    assert maps.panels[1].load[1] == pytest.approx([64 * 4 / 768, 64 * 4 / 768, 576 * 4 / 768, 64 * 4 / 768])
    for panel in maps.panels[2:]:
        assert panel.load == [[1.0] * E, [0.0, 0.0, 4.0, 0.0]]
    assert maps.busiest[0] == [1.0] * 10 and maps.busiest[1] == [1.0] * 4 + [4.0] * 6


def test_rows_without_or_with_broken_routing_fields_are_left_out():
    rows = _rows(3, balanced)
    rows.insert(1, {"step": 1, "val_loss": 4.0})  # an eval row
    rows[0]["moe_layers"] = ["1", 3]  # a layer that is not an index
    rows[2]["expert_tokens"] = [[1, 2, 3]]  # one list for two layers
    rows[3]["expert_tokens"] = [[1, 2, 3, -1], [1, 1, 1, 1]]  # a negative count
    assert load_maps(rows) is None  # no whole row left
    rows += _rows(2, collapsing)[1:]  # a whole row: step 2 (still even)
    maps = load_maps(rows)
    assert maps.steps == [2] and maps.panels[0].load == [[1.0] * E, [1.0] * E]
    assert load_maps(_rows(3, lambda step: None)) is None


def test_the_time_strip_cells_span_halfway_to_the_neighbouring_logged_steps():
    assert _edges([1, 2, 4, 6]) == [0.5, 1.5, 3.0, 5.0, 7.0]  # step 1 is always logged, then every log_interval
    assert _edges([10]) == [9.5, 10.5]


def test_summary_lines_name_the_busiest_layer_and_the_idle_experts():
    assert summary_rows(_rows(8, collapsing)) == [
        ("expert load (step 8)", "busiest 4.00x even at layer 3; 3 idle expert(s) over 2 sparse layer(s)"),
        ("router losses (step 8)", "aux_loss 1.0800, router_z_loss 2.0000")]
    assert summary_rows(_rows(8, lambda step: None)) == []


def uneven(step):
    return [[100, 60, 40, 56], [64, 64, 64, 64]]


def test_ep_ranks_sum_their_experts():
    assert rank_counts([100, 60, 40, 56], 2) == [160, 96]
    assert rank_counts([100, 60, 40, 56], 4) == [100, 60, 40, 56]
    assert rank_counts([1, 2, 3, 4, 5, 6, 7, 8], 4) == [3, 7, 11, 15]


def test_an_ep_run_gets_a_strip_of_its_busiest_rank():
    maps = load_maps(_rows(10, collapsing, ep=2))
    assert maps.ep == 2
    # Layer 3's tokens all go to expert 2 from step 5 on: rank 1 (experts 2-3) gets every pair, rank 0 none.
    assert maps.ep_busiest == [[1.0] * 10, [1.0] * 4 + [2.0] * 6]
    assert load_maps(_rows(10, collapsing, ep=4)).ep_busiest == [[1.0] * 10, [1.0] * 4 + [4.0] * 6]
    maps = load_maps(_rows(2, uneven, ep=2))
    assert maps.ep_busiest[0] == [160 * 2 / 256] * 2 and maps.busiest[0] == [100 * 4 / 256] * 2
    assert load_maps(_rows(2, uneven, ep=4)).ep_busiest[0] == [100 * 4 / 256] * 2


def test_ep1_rows_and_broken_ep_fields_give_no_ep_strip():
    maps = load_maps(_rows(4, collapsing))
    assert maps.ep == 1 and maps.ep_busiest == []
    rows = _rows(2, balanced, ep=2)
    assert row_ep(rows[0], E) == 2
    rows[0]["ep_tokens"] = [[64, 64, 64], [64, 64, 64]]  # 3 ranks do not split 4 experts
    rows[1]["ep_tokens"] = [[128, 128]]  # one list for two layers
    assert [row_ep(r, E) for r in rows] == [1, 1] and load_maps(rows).ep == 1


def test_steps_logged_under_another_ep_are_blank_in_the_strip():
    rows = _rows(2, collapsing) + _rows(4, collapsing, ep=2)[2:]  # resumed at step 3 with ep 2
    strip = load_maps(rows).ep_busiest
    assert [math.isnan(v) for v in strip[0]] == [True, True, False, False] and strip[1][2:] == [1.0, 1.0]


def test_summary_of_an_ep_run_names_the_busiest_rank_and_the_idle_ones():
    assert summary_rows(_rows(8, collapsing, ep=2)) == [
        ("expert load (step 8)", "busiest 4.00x even at layer 3; 3 idle expert(s) over 2 sparse layer(s)"),
        ("ep load (step 8)", "busiest 2.00x even at layer 3, rank 1 of 2 (2 expert(s) per rank); 1 idle rank(s) "
                             "over 2 sparse layer(s)"),
        ("router losses (step 8)", "aux_loss 1.0800, router_z_loss 2.0000")]
    assert summary_rows(_rows(1, uneven, ep=2))[1] == (
        "ep load (step 1)", "busiest 1.25x even at layer 1, rank 0 of 2 (2 expert(s) per rank); 0 idle rank(s) "
                            "over 2 sparse layer(s)")
    assert summary_rows(_rows(1, uneven, ep=4))[1][1].startswith("busiest 1.56x even at layer 1, rank 0 of 4 (1 ")
    assert [label for label, _ in summary_rows(_rows(8, collapsing))] == [
        "expert load (step 8)", "router losses (step 8)"]


def test_the_heat_map_marks_the_ep_ranks_and_draws_their_strip(monkeypatch):
    from llmtrain.report import run_report as report
    from llmtrain.report.plotting import pyplot

    plt = pyplot()
    figures = []
    monkeypatch.setattr(report, "_save", lambda plt_, fig, path: figures.append((path.rsplit("/", 1)[1], fig)))
    report.plot_all(plt, _rows(8, collapsing, ep=2), "/nowhere", "t")
    axes = dict(figures)["expert_load.png"].axes
    panels = [ax for ax in axes if ax.get_xlabel() == "expert"]
    assert len(panels) == 4
    # One line between rank 0's experts (0, 1) and rank 1's (2, 3), in every panel.
    assert [[list(line.get_xdata()) for line in ax.get_lines()] for ax in panels] == [[[1.5, 1.5]]] * 4
    (strip,) = [ax for ax in axes if ax.get_title().startswith("busiest ep rank's load")]
    assert strip.collections[0].get_array().reshape(2, 8).tolist() == [[1.0] * 8, [1.0] * 4 + [2.0] * 4]
    figures.clear()
    report.plot_all(plt, _rows(8, collapsing), "/nowhere", "t")
    axes = dict(figures)["expert_load.png"].axes
    assert not any(ax.get_title().startswith("busiest ep rank") for ax in axes)
    assert all(ax.get_lines() == [] for ax in axes if ax.get_xlabel() == "expert")
    plt.close("all")


def test_report_of_an_ep_run_prints_its_rank_load(tmp_path, capsys, monkeypatch):
    out, written = _report(tmp_path, _rows(10, collapsing, ep=2), capsys, monkeypatch)
    assert "expert_load.png" in written
    assert "busiest 2.00x even at layer 3, rank 1 of 2 (2 expert(s) per rank); 1 idle rank(s) over 2 sparse" in out


def _report(tmp_path, rows, capsys, monkeypatch) -> tuple[str, list[str]]:
    monkeypatch.setenv("COLUMNS", "200")
    run_dir = tmp_path / "run"
    run_dir.mkdir(exist_ok=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    parser = argparse.ArgumentParser()
    add_report_arguments(parser)
    assert run_report(parser.parse_args([str(run_dir)])) == 0
    return capsys.readouterr().out, sorted(p.name for p in (run_dir / "report").iterdir())


def test_report_of_a_moe_run_writes_the_heat_map(tmp_path, capsys, monkeypatch):
    out, written = _report(tmp_path, _rows(10, collapsing), capsys, monkeypatch)
    assert written == ["expert_load.png", "loss.png", "lr.png", "throughput.png"]
    assert (tmp_path / "run" / "report" / "expert_load.png").read_bytes()[:8] == PNG_SIGNATURE
    assert "busiest 4.00x even at layer 3; 3 idle expert(s) over 2 sparse layer(s)" in out
    assert "aux_loss 1.1000, router_z_loss 2.0000" in out
    assert str(tmp_path / "run" / "report" / "expert_load.png") in out.splitlines()[-1]  # the plots line


def test_report_takes_top_k_from_the_run_config(tmp_path, capsys, monkeypatch):
    from llmtrain.config import compose_config, to_yaml
    from llmtrain.report import expert_load

    asked = []
    draw = expert_load.plot_expert_load
    monkeypatch.setattr(expert_load, "plot_expert_load", lambda *a: asked.append(a[-1]) or draw(*a))
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.yaml").write_text(to_yaml(compose_config(["model=moe-tiny"])))
    _, written = _report(tmp_path, _rows(4, balanced), capsys, monkeypatch)
    assert asked == [2] and "expert_load.png" in written  # moe-tiny routes each token to 2 experts


def test_report_of_a_dense_run_says_nothing_of_experts(tmp_path, capsys, monkeypatch):
    out, written = _report(tmp_path, _rows(10, lambda step: None), capsys, monkeypatch)
    assert written == ["loss.png", "lr.png", "throughput.png"]
    assert "expert" not in out and "router" not in out and "aux_loss" not in out


def test_the_router_losses_are_drawn_beside_the_loss(monkeypatch):
    """loss.png gains a second panel with aux_loss (and router_z_loss on a twin axis) only for a MoE run."""
    from llmtrain.report import run_report as report
    from llmtrain.report.plotting import pyplot

    plt = pyplot()
    figures = []
    monkeypatch.setattr(report, "_save", lambda plt_, fig, path: figures.append((path.rsplit("/", 1)[1], fig)))
    report.plot_all(plt, _rows(6, collapsing), "/nowhere", "t")
    loss = dict(figures)["loss.png"]
    aux_ax = loss.axes[1]
    (line,) = aux_ax.get_lines()
    assert list(line.get_xdata()) == list(range(1, 7))
    assert list(line.get_ydata()) == pytest.approx([1.0 + 0.01 * s for s in range(1, 7)])
    assert [list(t.get_lines()[0].get_ydata()) for t in loss.axes[2:]] == [[2.0] * 6]  # z-loss, twin axis
    figures.clear()
    report.plot_all(plt, _rows(6, lambda step: None), "/nowhere", "t")
    assert len(dict(figures)["loss.png"].axes) == 1 and "expert_load.png" not in dict(figures)
    plt.close("all")
