"""Whether a measured difference between two trials is more than their noise. A trial's spread is the interquartile
range of its steps' tokens/s after the warm-up (the middle half of its steps: on a loaded machine a few slow
steps do not widen it, a noisy one does). A refinement (`<layout>+fused`, `+compile`) replaces its layout only when
it is faster by more than both trials' spreads; otherwise it is within noise, and the layout is kept: a switch
must earn its place, the layout is what the plan ranked."""

from __future__ import annotations

from llmtrain.tune.trials import Trial

FASTER, WITHIN_NOISE, SLOWER = "faster", "within noise", "slower"


def spread(trial: Trial) -> float:
    """The trial's interquartile range of tokens/s; 0 for a trial recorded without one."""
    if trial.tokens_per_s_q1 is None or trial.tokens_per_s_q3 is None:
        return 0.0
    return trial.tokens_per_s_q3 - trial.tokens_per_s_q1


def verdict(refinement: Trial, layout: Trial) -> str:
    """FASTER when the refinement's median beats the layout's by more than either trial's spread, SLOWER when it
    trails by more, else WITHIN_NOISE."""
    gain = refinement.tokens_per_s - layout.tokens_per_s
    noise = max(spread(refinement), spread(layout))
    if gain > noise:
        return FASTER
    return SLOWER if -gain > noise else WITHIN_NOISE


def compared(trials: list[Trial]) -> dict[str, tuple[str, float]]:
    """{refinement's name: (verdict, gain over its layout as a fraction)} for each measured refinement whose
    layout was measured."""
    by_name = {t.layout: t for t in trials if t.measured}
    out = {}
    for t in trials:
        layout = by_name.get(t.refines)
        if t.measured and layout is not None:
            out[t.layout] = (verdict(t, layout), t.tokens_per_s / layout.tokens_per_s - 1)
    return out


def winner(trials: list[Trial]) -> Trial | None:
    """The measured-fastest layout (ties: the first, which the plan ranked higher), or its fastest refinement
    that is faster beyond the noise."""
    layouts = [t for t in trials if t.measured and not t.refines]
    if not layouts:
        return None
    best = max(layouts, key=lambda t: t.tokens_per_s)
    better = [t for t in trials if t.refines == best.layout and t.measured and verdict(t, best) == FASTER]
    return max(better, key=lambda t: t.tokens_per_s) if better else best
