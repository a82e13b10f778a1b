"""A data=mix run's sources in `llmtrain report`: the tokens each source has given (the last training row's
source_tokens) with their share, and each source's validation loss (the last eval row's source_val_loss)."""

from __future__ import annotations

import math
import os


def _numbers(value) -> dict[str, float]:
    """{name: number} of a metrics field that should be one; anything else in it is left out."""
    if not isinstance(value, dict):
        return {}
    return {str(k): float(v) for k, v in value.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}


def source_rows(rows: list[dict]) -> list[tuple[str, str, str, str]]:
    """(source, tokens, share of the tokens, val loss) per source, in the order the metrics name them; [] for a
    run without per-source fields."""
    tokens = next((_numbers(r["source_tokens"]) for r in reversed(rows) if _numbers(r.get("source_tokens"))), {})
    evals = [r for r in rows if _numbers(r.get("source_val_loss"))]
    val = _numbers(evals[-1]["source_val_loss"]) if evals else {}
    total = sum(tokens.values())
    out = []
    for name in [*tokens, *(n for n in val if n not in tokens)]:
        count = f"{int(tokens[name]):,}" if name in tokens else "-"
        share = f"{100 * tokens[name] / total:.1f}%" if name in tokens and total > 0 else "-"
        out.append((name, count, share, f"{val[name]:.4f}" if name in val else "-"))
    return out


def val_loss_step(rows: list[dict]) -> int | None:
    """The step of the last eval row with per-source losses."""
    evals = [r for r in rows if _numbers(r.get("source_val_loss"))]
    return evals[-1].get("step") if evals else None


def plot_source_val_loss(plt, rows: list[dict], out_dir: str, title: str, save) -> str | None:
    """source_val_loss.png: one validation-loss curve per source; None when no row has per-source losses."""
    curves: dict[str, list[tuple[int, float]]] = {}
    for r in rows:
        if isinstance(r.get("step"), int):
            for name, loss in _numbers(r.get("source_val_loss")).items():
                curves.setdefault(name, []).append((r["step"], loss))
    if not curves:
        return None
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for name, points in curves.items():
        ax.plot([p[0] for p in points], [p[1] for p in points], "o-", label=name, linewidth=1.0, markersize=3)
    ax.legend()
    ax.set(xlabel="step", ylabel="val loss", title=f"{title}: val loss per source")
    ax.grid(alpha=0.3)
    path = os.path.join(out_dir, "source_val_loss.png")
    save(plt, fig, path)
    return path
