"""A mixture-of-experts run's routing in `llmtrain report`, read from metrics.jsonl: the expert-load heat map
(expert_load.png, from each logged row's `moe_layers` and `expert_tokens`), the router's losses beside the loss
curve (`aux_loss`, `router_z_loss`), and two summary lines. A run whose rows carry none of these gets none of it.

expert_load.png, and why it looks as it does: a router that collapses sends most of a layer's tokens to one or a
few experts while the rest starve, and it usually gets there gradually. So the figure shows load against an even
split, on one fixed scale, at several times:

- top: one panel per quarter of the logged rows, layer x expert, each cell that expert's share of the layer's
  routed tokens over those steps times the number of experts (1 = an even split; n_experts / top_k = every token,
  as a token goes to top_k different experts). The colours diverge around 1: a balanced router is a flat, pale
  panel; a collapsed layer is top_k dark red cells in a blue row. The scale runs from 0 to that ceiling in every
  panel, so panels compare by eye and the quarters show whether, and in which layers, the load drifts;
- below: layer x logged step, the busiest expert's load that step (the metrics' expert_load): when a layer began
  to collapse, to the log interval.

Under expert parallel (rows with `ep_tokens`, ep > 1) what costs time is the busiest rank, not the busiest
expert: every step waits for the rank that received the most token-expert pairs. So the top panels mark which
ep rank holds which experts (a line between ranks' experts, the ranks named on top), and a third strip shows,
layer x logged step, the busiest ep rank's load (its pairs over the mean per rank; the metrics' ep_load), on the
same scale.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

QUARTERS = 4


@dataclass
class Panel:
    first_step: int
    last_step: int
    load: list[list[float]]  # [layer][expert]: share of the layer's tokens over these steps x n_experts


@dataclass
class LoadMaps:
    """What expert_load.png draws."""

    layers: list[int]  # global indices of the sparse layers: the rows of every image
    n_experts: int
    ceiling: float  # the most load one expert can have: n_experts / top_k (n_experts when top_k is not known)
    panels: list[Panel]  # one per quarter of the logged rows (fewer when fewer rows are logged)
    steps: list[int]  # the logged steps: the columns of `busiest`
    busiest: list[list[float]]  # [layer][step]: busiest expert's tokens / mean tokens per expert
    ep: int = 1  # expert-parallel ranks of the last routed row; rank j holds experts [j E/ep, (j+1) E/ep)
    # [layer][step]: busiest ep rank's pairs / mean per rank; nan at a step logged under another ep; [] for ep 1
    ep_busiest: list[list[float]] = field(default_factory=list)


def _count(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0


def _routing(row: dict) -> tuple[tuple[int, ...], list[list[float]]] | None:
    """(moe_layers, expert_tokens) of a row that carries both, whole and consistent; None otherwise."""
    layers, tokens = row.get("moe_layers"), row.get("expert_tokens")
    if not isinstance(row.get("step"), int) or not isinstance(layers, list) or not isinstance(tokens, list):
        return None
    if not layers or len(layers) != len(tokens) or not all(isinstance(i, int) for i in layers):
        return None
    if not all(isinstance(t, list) and t and len(t) == len(tokens[0]) and all(map(_count, t)) for t in tokens):
        return None
    return tuple(layers), [[float(c) for c in t] for t in tokens]


def row_ep(row: dict, n_experts: int) -> int:
    """The expert-parallel ranks of a routed row: how many `ep_tokens` gives per layer when whole, above 1 and a
    divisor of n_experts; 1 otherwise (an ep=1 run has no ep_tokens)."""
    ranks, tokens = row.get("ep_tokens"), row.get("expert_tokens")
    if not isinstance(ranks, list) or not ranks or len(ranks) != len(tokens):
        return 1
    ep = len(ranks[0]) if isinstance(ranks[0], list) else 0
    if ep < 2 or n_experts % ep or not all(isinstance(r, list) and len(r) == ep for r in ranks):
        return 1
    return ep


def rank_counts(counts: list[float], ep: int) -> list[float]:
    """A layer's expert counts summed per ep rank (rank j: experts [j E/ep, (j+1) E/ep))."""
    per = len(counts) // ep
    return [sum(counts[j * per:(j + 1) * per]) for j in range(ep)]


def load_vs_even(counts: list[float]) -> list[float]:
    """Each expert's tokens / the mean per expert (1 = an even split); zeros for a layer that got no tokens."""
    total = sum(counts)
    return [c * len(counts) / total if total > 0 else 0.0 for c in counts]


def load_maps(rows: list[dict], top_k: int | None = None) -> LoadMaps | None:
    """The heat map's data; None when no row carries the routing fields. The layers and expert count are the last
    such row's; a row that disagrees with them is left out. `top_k` (the run's model.moe.top_k) sets the ceiling."""
    routed = [(r["step"], got, r) for r in rows if (got := _routing(r)) is not None]
    if not routed:
        return None
    layers, last = routed[-1][1]
    n_experts = len(last[0])
    routed = [(step, tokens, row_ep(r, n_experts)) for step, (lay, tokens), r in routed
              if lay == layers and len(tokens[0]) == n_experts]
    chunks = _split(routed, min(QUARTERS, len(routed)))
    panels = [Panel(chunk[0][0], chunk[-1][0],
                    [load_vs_even([sum(t[i][e] for _, t, _ in chunk) for e in range(n_experts)])
                     for i in range(len(layers))])
              for chunk in chunks]
    busiest = [[max(load_vs_even(t[i])) for _, t, _ in routed] for i in range(len(layers))]
    ep = routed[-1][2]
    ep_busiest = [[max(load_vs_even(rank_counts(t[i], ep))) if e == ep else math.nan for _, t, e in routed]
                  for i in range(len(layers))] if ep > 1 else []
    ceiling = n_experts / top_k if top_k else float(n_experts)
    return LoadMaps(list(layers), n_experts, ceiling, panels, [step for step, _, _ in routed], busiest, ep,
                    ep_busiest)


def _split(items: list, n: int) -> list[list]:
    """`items` in n contiguous runs whose lengths differ by at most one, the longer ones first."""
    size, extra = divmod(len(items), n)
    out, start = [], 0
    for k in range(n):
        end = start + size + (1 if k < extra else 0)
        out.append(items[start:end])
        start = end
    return out


def plot_expert_load(plt, rows: list[dict], out_dir: str, title: str, save, top_k: int | None = None) -> str | None:
    """expert_load.png (see the module docstring); None, and nothing written, for a run without routing fields."""
    maps = load_maps(rows, top_k)
    if maps is None:
        return None
    from matplotlib.colors import TwoSlopeNorm

    norm = TwoSlopeNorm(vmin=0.0, vcenter=1.0, vmax=max(2.0, maps.ceiling))
    n = len(maps.panels)
    strips = [(maps.busiest, "busiest expert's load per logged step")]
    if maps.ep > 1:
        strips.append((maps.ep_busiest, f"busiest ep rank's load per logged step (1 = balanced, {maps.ep} = one "
                                        "rank gets every pair)"))
    fig = plt.figure(figsize=(max(8.0, 3.2 * n), 3.0 + 0.35 * len(maps.layers) * (1 + 0.4 * len(strips))))
    grid = fig.add_gridspec(1 + len(strips), n + 1, height_ratios=[3] + [2] * len(strips),
                            width_ratios=[1.0] * n + [0.06])
    labels = [str(i) for i in maps.layers]
    image = None
    for k, panel in enumerate(maps.panels):
        ax = fig.add_subplot(grid[0, k])
        image = ax.imshow(panel.load, cmap="RdBu_r", norm=norm, aspect="auto", interpolation="nearest")
        ax.set_title(f"steps {panel.first_step}-{panel.last_step}", fontsize=9)
        ax.set_xlabel("expert")
        ax.set_yticks(range(len(labels)), labels if k == 0 else [""] * len(labels))
        if k == 0:
            ax.set_ylabel("layer")
        if maps.ep > 1:
            _mark_ep_ranks(ax, maps.n_experts, maps.ep)
    for row, (values, what) in enumerate(strips, start=1):
        ax = fig.add_subplot(grid[row, :n])
        ax.pcolormesh(_edges(maps.steps), [i - 0.5 for i in range(len(labels) + 1)], values, cmap="RdBu_r",
                      norm=norm)
        ax.invert_yaxis()
        ax.set_yticks(range(len(labels)), labels)
        ax.set(xlabel="step", ylabel="layer", title=what)
    fig.suptitle(f"{title}: expert load (tokens / even share; 1 = balanced, {maps.ceiling:g} = every token)",
                 fontsize=10)
    fig.colorbar(image, cax=fig.add_subplot(grid[:, n]), label="load vs even split")
    path = os.path.join(out_dir, "expert_load.png")
    save(plt, fig, path)
    return path


def _mark_ep_ranks(ax, n_experts: int, ep: int) -> None:
    """A line between the experts of neighbouring ep ranks, and the ranks named on top (when they fit)."""
    per = n_experts // ep
    for j in range(1, ep):
        ax.axvline(j * per - 0.5, color="black", linewidth=0.8)
    if ep <= 16:
        top = ax.secondary_xaxis("top")
        top.set_xticks([j * per + (per - 1) / 2 for j in range(ep)], [f"r{j}" for j in range(ep)], fontsize=7)
        top.tick_params(length=0)


def _edges(steps: list[int]) -> list[float]:
    """Cell edges around each logged step, halfway to its neighbours (log steps need not be evenly spaced)."""
    if len(steps) == 1:
        return [steps[0] - 0.5, steps[0] + 0.5]
    mids = [(a + b) / 2 for a, b in zip(steps, steps[1:])]
    return [steps[0] - (mids[0] - steps[0]), *mids, steps[-1] + (steps[-1] - mids[-1])]


# ---------------------------------------------------------------------------------------------------- router losses

def _series(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
    pts = [(r["step"], float(r[key])) for r in rows if isinstance(r.get("step"), int) and _number(r.get(key))]
    return [p[0] for p in pts], [p[1] for p in pts]


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def has_router_losses(rows: list[dict]) -> bool:
    return any(_number(r.get("aux_loss")) for r in rows)


def plot_router_losses(ax, rows: list[dict], title: str) -> None:
    """aux_loss (left axis; 1.0 = balanced) and router_z_loss (right axis, when logged) against the step."""
    steps, aux = _series(rows, "aux_loss")
    ax.plot(steps, aux, color="tab:purple", label="aux_loss (1.0 = balanced)", linewidth=1.2)
    ax.set(xlabel="step", ylabel="load-balancing loss", title=f"{title}: router losses")
    ax.grid(alpha=0.3)
    lines = ax.get_lines()
    zsteps, z = _series(rows, "router_z_loss")
    if zsteps:
        twin = ax.twinx()
        twin.plot(zsteps, z, color="tab:brown", label="router_z_loss", linewidth=1.0)
        twin.set_ylabel("router z-loss")
        lines = lines + twin.get_lines()
    ax.legend(lines, [line.get_label() for line in lines], loc="upper right")


# ---------------------------------------------------------------------------------------------------- summary

def summary_rows(rows: list[dict]) -> list[tuple[str, str]]:
    """The summary table's lines of a MoE run's last routed row: its router losses, the busiest expert's load at
    that step and, under expert parallel, the busiest ep rank's; [] for a run without routing fields."""
    last = next((r for r in reversed(rows) if _routing(r) is not None), None)
    if last is None:
        return []
    layers, tokens = _routing(last)
    loads = [max(load_vs_even(t)) for t in tokens]
    worst = max(range(len(loads)), key=lambda i: loads[i])
    idle = sum(1 for t in tokens for c in t if c == 0)
    out = [(f"expert load (step {last['step']})",
            f"busiest {loads[worst]:.2f}x even at layer {layers[worst]}; {idle} idle expert(s) over "
            f"{len(layers)} sparse layer(s)")]
    ep = row_ep(last, len(tokens[0]))
    if ep > 1:
        out.append((f"ep load (step {last['step']})", _ep_line(layers, tokens, ep)))
    losses = [f"{key} {float(last[key]):.4f}" for key in ("aux_loss", "router_z_loss") if _number(last.get(key))]
    if losses:
        out.append((f"router losses (step {last['step']})", ", ".join(losses)))
    return out


def _ep_line(layers: tuple[int, ...], tokens: list[list[float]], ep: int) -> str:
    """The busiest ep rank's load, its layer and rank (the lowest of equals), and the ranks that got nothing."""
    ranks = [rank_counts(t, ep) for t in tokens]
    loads = [max(load_vs_even(r)) for r in ranks]
    worst = max(range(len(loads)), key=lambda i: loads[i])
    rank = max(range(ep), key=lambda j: ranks[worst][j])
    idle = sum(1 for r in ranks for c in r if c == 0)
    return (f"busiest {loads[worst]:.2f}x even at layer {layers[worst]}, rank {rank} of {ep} "
            f"({len(tokens[0]) // ep} expert(s) per rank); {idle} idle rank(s) over {len(layers)} sparse layer(s)")
