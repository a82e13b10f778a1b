"""Comparing a layout's metrics rows with one process's: the losses, gradient norms and validation losses of every
step to 1e-5 (fp32 on CPU), and that the losses compared actually move."""

from __future__ import annotations

TOL = 1e-5


def by_step(rows) -> dict[int, dict]:
    """Each step's metrics rows merged: its training row and, at an evaluation, its val_loss."""
    merged: dict[int, dict] = {}
    for r in rows:
        if "loss" in r or "val_loss" in r:
            merged.setdefault(r["step"], {}).update(r)
    return merged


def assert_parity(rows, reference, label, steps=range(1, 11)):
    got = by_step(rows)
    assert sorted(got) == list(steps) and sorted(reference) == list(range(1, 11)), label
    reference = {s: reference[s] for s in steps}
    loss_diff = max(abs(got[s]["loss"] - reference[s]["loss"]) for s in reference)
    norm_diff = max(abs(got[s]["grad_norm"] - reference[s]["grad_norm"]) / reference[s]["grad_norm"]
                    for s in reference)
    assert loss_diff <= TOL, f"{label}: max |loss diff| {loss_diff:.2e} > {TOL}"
    evaluated = [s for s in steps if "val_loss" in reference[s]]
    assert evaluated and evaluated == [s for s in steps if "val_loss" in got[s]], f"{label}: evaluations"
    val_diff = max(abs(got[s]["val_loss"] - reference[s]["val_loss"]) for s in evaluated)
    assert val_diff <= TOL, f"{label}: max |val_loss diff| {val_diff:.2e} > {TOL}"
    assert norm_diff <= TOL, f"{label}: max relative grad-norm diff {norm_diff:.2e} > {TOL}"
    first, last = min(steps), max(steps)
    drop = 0.3 if first == 1 else 0.1  # the losses compared actually move (less in a run's second half)
    assert reference[last]["loss"] < reference[first]["loss"] - drop
