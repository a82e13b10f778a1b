"""A refinement (`<layout>+fused`, `+compile`) wins the tune only when it is faster than its layout beyond both
trials' spreads; within the noise the layout is kept, and the table says so."""

from __future__ import annotations

import io
import json

from rich.console import Console

from llmtrain.tune import noise, table, trials
from llmtrain.tune.trials import Trial

LAYOUT = "dp2-tp1-pp1-zero0-mb8-rc-none"


def _trial(name: str, tokens: float, q1: float, q3: float, refines: str = "") -> Trial:
    return Trial(name, [], 1000.0, None, 1.0, 1.0, 0.0, tokens_per_s=tokens, tokens_per_s_q1=q1,
                 tokens_per_s_q3=q3, peak_gib=0.5, refines=refines)


def test_a_refinement_within_the_noise_keeps_the_layout():
    layout = _trial(LAYOUT, 1000.0, 950.0, 1050.0)  # spread 100
    fused = _trial(LAYOUT + "+fused", 1060.0, 1030.0, 1090.0, refines=LAYOUT)  # +60, inside the layout's 100
    assert noise.verdict(fused, layout) == noise.WITHIN_NOISE
    assert noise.winner([layout, fused]) is layout
    # Faster by more than its own spread is not enough: the layout's is wider.
    tight = _trial(LAYOUT + "+fused", 1080.0, 1075.0, 1085.0, refines=LAYOUT)
    assert noise.winner([layout, tight]) is layout


def test_a_refinement_beyond_both_spreads_wins():
    layout = _trial(LAYOUT, 1000.0, 950.0, 1050.0)
    compiled = _trial(LAYOUT + "+compile", 1200.0, 1150.0, 1260.0, refines=LAYOUT)  # +200 > 110 and 100
    fused = _trial(LAYOUT + "+fused", 1150.0, 1140.0, 1160.0, refines=LAYOUT)  # +150, also beyond
    assert noise.verdict(compiled, layout) == noise.FASTER
    assert noise.winner([layout, fused, compiled]) is compiled
    slow = _trial(LAYOUT + "+eager", 700.0, 690.0, 710.0, refines=LAYOUT)
    assert noise.verdict(slow, layout) == noise.SLOWER and noise.winner([layout, slow]) is layout


def test_layouts_are_ranked_by_their_medians_and_old_records_have_no_spread():
    other = _trial("dp1-tp2-pp1-zero0-mb8-rc-none", 900.0, 100.0, 2000.0)
    layout = _trial(LAYOUT, 1000.0, 990.0, 1010.0)
    assert noise.winner([other, layout]) is layout
    recorded = Trial(LAYOUT + "+fused", [], 1000.0, None, 1.0, 1.0, 0.0, tokens_per_s=1001.0, refines=LAYOUT)
    assert noise.spread(recorded) == 0.0
    assert noise.winner([_trial(LAYOUT, 1000.0, 1000.0, 1000.0), recorded]).layout == LAYOUT + "+fused"


def test_the_table_shows_each_spread_and_the_refinement_within_noise():
    layout = _trial(LAYOUT, 1000.0, 950.0, 1050.0)
    fused = _trial(LAYOUT + "+fused", 1060.0, 1030.0, 1090.0, refines=LAYOUT)
    console = Console(record=True, width=250, file=io.StringIO())
    table.render([layout, fused], "tune", console)
    text = console.export_text()
    rows = {cells[0]: cells[1:] for cells in ([c.strip() for c in line.strip("│").split("│")]
                                              for line in text.splitlines() if "│" in line)}
    header = next(line for line in text.splitlines() if "┃" in line)
    assert [h.strip() for h in header.strip("┃").split("┃")][-2:] == ["q1-q3 tokens/s", "vs. layout"]
    assert rows[LAYOUT][-2:] == ["950-1,050", ""]
    assert rows[LAYOUT + "+fused"][-2:] == ["1,030-1,090", "+6.0%, within noise"]


def test_the_trial_keeps_the_quartiles_of_its_steps(tmp_path):
    speeds = [100.0, 900.0, 1000.0, 1100.0, 1000.0, 300.0, 1050.0, 950.0]  # step 1 is warm-up
    rows = [{"step": s, "tokens_per_s": v} for s, v in enumerate(speeds, 1)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    trial = Trial("x", [], 1.0, None, 1.0, 1.0, 0.0)
    trials.measure(trial, str(tmp_path), steps=4)  # 1 warm-up step below 8 steps
    assert trial.tokens_per_s == 1000.0 and trial.measured_steps == 7
    assert (trial.tokens_per_s_q1, trial.tokens_per_s_q3) == (925.0, 1025.0)
