"""Whether this forward is activation recompute's second run of a block (statistics must not count it twice).

torch.utils.checkpoint recomputes inside backward, while the autograd engine runs a graph task; a first forward
runs outside any. Under torch.compile the traced forward is the only run of this Python code (a compiled
backward replays the graph, not it), so a compiled forward always counts, and the C call stays out of the trace.
"""

from __future__ import annotations

import torch


def recomputing() -> bool:
    if torch.compiler.is_compiling():
        return False
    return torch._C._current_graph_task_id() != -1
