"""matplotlib for `llmtrain report` and `llmtrain compare`. It is an optional extra (`llmtrain[plot]`): without it
both commands still print their tables, and one line says how to get the plots."""

from __future__ import annotations

PLOT_EXTRA = "pip install 'llmtrain[plot]' (in a checkout: pip install -e '.[plot]')"
NO_PLOTS = f"plots: none, matplotlib is not installed; for PNG plots: {PLOT_EXTRA}"


def pyplot():
    """matplotlib.pyplot on the Agg backend (files only, no display), or None when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt
