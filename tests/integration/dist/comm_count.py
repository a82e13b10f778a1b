"""torchrun script: count the collectives one transformer layer issues under tensor parallel.

Builds the TP=2 model with 2 and with 4 layers, counts DTensor's functional collectives in forward and backward,
and writes the per-layer difference to the JSON file named by argv[1] (rank 0), for TP with and without sequence
parallel, for GPT-2 (keys tp, sp) and Llama with 4 query heads sharing 2 key/value heads (llama_tp, llama_sp).
"""

import functools
import json
import sys
from collections import Counter

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn.functional as F

from llmtrain.config import compose_config
from llmtrain.parallel.build import build_parallel_model
from llmtrain.parallel.layout import ParallelDims
from llmtrain.parallel.mesh import build_mesh

COUNTS: Counter = Counter()
PHASE = ["idle"]
COLLECTIVES = ("all_reduce", "all_gather_tensor", "all_gather_tensor_autograd", "reduce_scatter_tensor",
               "reduce_scatter_tensor_autograd", "all_to_all_single", "all_gather_single", "reduce_scatter_single")


def _counting(name, fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        COUNTS[(PHASE[0], name)] += 1
        return fn(*args, **kwargs)
    return wrapper


for _name in COLLECTIVES:
    if hasattr(funcol, _name):
        setattr(funcol, _name, _counting(_name, getattr(funcol, _name)))


def counts(n_layers: int, sequence_parallel: bool, arch: str) -> dict:
    model_option = ["model=llama-tiny"] if arch == "llama" else []
    cfg = compose_config([*model_option, "parallel.tp=2", f"model.n_layers={n_layers}", "model.d_model=64",
                          "model.seq_len=32", "cluster.nproc_per_node=2",
                          f"parallel.sequence_parallel={sequence_parallel}"])
    dims = ParallelDims.from_config(cfg)
    model = build_parallel_model(cfg, dims, build_mesh(dims, "cpu"), torch.device("cpu"))
    x = torch.randint(0, 256, (2, 32))
    COUNTS.clear()
    with model.loss_context():
        PHASE[0] = "forward"
        loss = F.cross_entropy(model.parts[0](x).flatten(0, 1), x.flatten())
        PHASE[0] = "backward"
        loss.backward()
    PHASE[0] = "idle"
    out: dict = {"forward": {}, "backward": {}}
    for (phase, name), n in COUNTS.items():
        if phase in out:
            out[phase][name] = n
    return out


def main() -> None:
    dist.init_process_group("gloo")
    result = {}
    for arch, sp in (("gpt2", False), ("gpt2", True), ("llama", False), ("llama", True)):
        two, four = counts(2, sp, arch), counts(4, sp, arch)
        result[("llama_" if arch == "llama" else "") + ("sp" if sp else "tp")] = {
            "per_layer": {phase: {op: (four[phase].get(op, 0) - two[phase].get(op, 0)) / 2
                                  for op in set(four[phase]) | set(two[phase])}
                          for phase in ("forward", "backward")},
            "two_layers": two}
    if dist.get_rank() == 0:
        with open(sys.argv[1], "w") as f:
            json.dump(result, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
