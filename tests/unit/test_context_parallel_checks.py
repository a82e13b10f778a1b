"""parallel.cp's checks before launch, one line each naming the key, and where cp sits among the ranks."""

from __future__ import annotations

import pytest

from helpers.refusals import validate_refusal as refusal

from llmtrain.config import compose_config
from llmtrain.config.validate import validate
from llmtrain.parallel.layout import ParallelDims


@pytest.mark.parametrize("overrides, key, message", [
    (["model=llama-tiny", "model.seq_len=60", "parallel.cp=4", "cluster.nproc_per_node=4"], "parallel.cp",
     "cp=4 splits each sequence into 2 x cp = 8 equal chunks: model.seq_len=60 is not divisible by 8"),
    (["model=moe-tiny", "parallel.cp=2", "parallel.ep=2", "cluster.nproc_per_node=4"], "parallel.cp",
     "cp=2 with expert parallel (parallel.ep=2) is not supported yet: the experts would need their gradients "
     "averaged over the cp ranks too; use one of them"),
    (["model=llama-tiny", "parallel.cp=3", "cluster.nproc_per_node=4"], "parallel.tp",
     "world size 4 (cluster.nnodes x cluster.nproc_per_node) is not divisible by parallel.tp x parallel.pp x "
     "parallel.cp = 3"),
    (["model=llama-tiny", "parallel.cp=2", "parallel.dp=4", "cluster.nproc_per_node=4"], "parallel.dp",
     "dp x cp x tp x pp = 4 x 2 x 1 x 1 = 8 must equal the world size cluster.nnodes x cluster.nproc_per_node = "
     "1 x 4 = 4"),
    (["model=llama-tiny", "model.n_kv_heads=4", "model.seq_len=36", "parallel.cp=2", "parallel.tp=4",
      "parallel.sequence_parallel=true", "cluster.nproc_per_node=8"], "parallel.sequence_parallel",
     "sequence parallel needs model.seq_len=36 divisible by parallel.tp=4 x parallel.cp=2"),
    (["model=llama-tiny", "parallel.cp=0"], "parallel.cp", "must be > 0 (got 0)"),
])
def test_layouts_context_parallel_cannot_take_are_refused(overrides, key, message):
    assert refusal(*overrides) == (key, message)


def test_cp_ranks_sit_between_data_parallel_and_pipeline():
    cfg = compose_config(["model=llama-tiny", "parallel.cp=2", "parallel.tp=2", "cluster.nproc_per_node=8"])
    validate(cfg)
    d = ParallelDims.from_config(cfg)
    assert (d.dp, d.cp, d.tp, d.world_size) == (2, 2, 2, 8)
    assert [(c["dp"], c["cp"], c["tp"]) for c in map(d.coords, range(8))] == [
        (0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 1, 1), (1, 0, 0), (1, 0, 1), (1, 1, 0), (1, 1, 1)]
    assert d.degrees == "dp=2 tp=2 pp=1 cp=2"
