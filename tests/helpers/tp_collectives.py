"""The collectives one transformer layer issues under tensor parallel, counted on forked ranks (helpers.ranks).

`per_layer(rank, world_size)` builds the TP=2 model with 2 and with 4 layers, counts DTensor's functional
collectives in forward and backward, and returns the per-layer difference for TP with and without sequence parallel,
for GPT-2 (keys tp, sp) and Llama with 4 query heads sharing 2 key/value heads (llama_tp, llama_sp).
"""

from __future__ import annotations

import functools
from collections import Counter

COLLECTIVES = ("all_reduce", "all_gather_tensor", "all_gather_tensor_autograd", "reduce_scatter_tensor",
               "reduce_scatter_tensor_autograd", "all_to_all_single", "all_gather_single", "reduce_scatter_single")


def _count_calls(counts: Counter, phase: list[str]) -> None:
    """Wrap funcol's collectives so each call is counted under the current phase. Done in the forked rank only:
    the test process's own collectives stay as they are."""
    import torch.distributed._functional_collectives as funcol

    def counting(name, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            counts[(phase[0], name)] += 1
            return fn(*args, **kwargs)
        return wrapper

    for name in COLLECTIVES:
        if hasattr(funcol, name):
            setattr(funcol, name, counting(name, getattr(funcol, name)))


def _counts(counts: Counter, phase: list[str], n_layers: int, sequence_parallel: bool, arch: str) -> dict:
    import torch
    import torch.nn.functional as F

    from llmtrain.config import compose_config
    from llmtrain.parallel.build import build_parallel_model
    from llmtrain.parallel.layout import ParallelDims
    from llmtrain.parallel.mesh import build_mesh

    model_option = ["model=llama-tiny"] if arch == "llama" else []
    cfg = compose_config([*model_option, "parallel.tp=2", f"model.n_layers={n_layers}", "model.d_model=64",
                          "model.seq_len=32", "cluster.nproc_per_node=2",
                          f"parallel.sequence_parallel={sequence_parallel}"])
    dims = ParallelDims.from_config(cfg)
    model = build_parallel_model(cfg, dims, build_mesh(dims, "cpu"), torch.device("cpu"))
    x = torch.randint(0, 256, (2, 32))
    counts.clear()
    with model.loss_context():
        phase[0] = "forward"
        loss = F.cross_entropy(model.parts[0](x).flatten(0, 1), x.flatten())
        phase[0] = "backward"
        loss.backward()
    phase[0] = "idle"
    out: dict = {"forward": {}, "backward": {}}
    for (when, name), n in counts.items():
        if when in out:
            out[when][name] = n
    return out


def per_layer(rank: int, world_size: int) -> dict:
    """Per layer and phase, how many of each collective; for run_ranks(2, per_layer)."""
    counts: Counter = Counter()
    phase = ["idle"]
    _count_calls(counts, phase)
    result = {}
    for arch, sp in (("gpt2", False), ("gpt2", True), ("llama", False), ("llama", True)):
        two, four = (_counts(counts, phase, n, sp, arch) for n in (2, 4))
        result[("llama_" if arch == "llama" else "") + ("sp" if sp else "tp")] = {
            "per_layer": {when: {op: (four[when].get(op, 0) - two[when].get(op, 0)) / 2
                                 for op in set(four[when]) | set(two[when])}
                          for when in ("forward", "backward")},
            "two_layers": two}
    return result
