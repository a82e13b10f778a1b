"""parallel.ep's checks before launch, one line each naming the key, and where ep is carved from (ParallelDims)."""

from __future__ import annotations

import pytest

from helpers.refusals import validate_refusal as refusal

from llmtrain.config import compose_config
from llmtrain.config.validate import validate
from llmtrain.parallel.layout import ParallelDims


@pytest.mark.parametrize("overrides, message", [
    (["model=gpt-tiny", "parallel.ep=2", "cluster.nproc_per_node=2"],
     "ep=2 splits a mixture of experts' experts, but model.moe is null (a dense model)"),
    (["model=moe-tiny", "parallel.ep=3", "cluster.nproc_per_node=3"], "ep=3 must divide model.moe.n_experts=8"),
    (["model=moe-tiny", "parallel.ep=4", "cluster.nproc_per_node=2"],
     "ep=4 must divide parallel.dp=2 (expert parallel is carved from the data-parallel ranks)"),
    (["model=moe-tiny", "parallel.ep=2", "parallel.tp=2", "cluster.nproc_per_node=2"],
     "ep=2 must divide parallel.dp=1 (expert parallel is carved from the data-parallel ranks)"),
    (["model=moe-tiny", "parallel.ep=4", "parallel.zero=3", "parallel.dp_shard=2", "cluster.nproc_per_node=4"],
     "ep=4 must divide the ZeRO shard group parallel.dp_shard=2 (expert parallel is carved from its ranks)"),
    (["model=moe-tiny", "parallel.ep=0"], "must be >= 1 (got 0)"),
])
def test_layouts_expert_parallel_cannot_take_are_refused(overrides, message):
    assert refusal(*overrides) == ("parallel.ep", message)


@pytest.mark.parametrize("overrides, expected", [
    # (dp, dp_shard, ep, expert_dp, expert_dp_shard)
    (["parallel.ep=2", "cluster.nproc_per_node=2"], (2, 1, 2, 1, 1)),
    (["parallel.ep=2", "cluster.nproc_per_node=8"], (8, 1, 2, 4, 1)),
    (["parallel.ep=2", "parallel.zero=3", "cluster.nproc_per_node=8"], (8, 8, 2, 4, 4)),
    (["parallel.ep=2", "parallel.zero=2", "parallel.dp_shard=4", "cluster.nproc_per_node=8"], (8, 4, 2, 4, 2)),
    (["parallel.ep=4", "parallel.pp=2", "parallel.tp=2", "cluster.nproc_per_node=16"], (4, 1, 4, 1, 1)),
])
def test_expert_parallel_is_carved_from_data_parallel(overrides, expected):
    cfg = compose_config(["model=moe-tiny", *overrides])
    validate(cfg)
    d = ParallelDims.from_config(cfg)
    assert (d.dp, d.dp_shard, d.ep, d.expert_dp, d.expert_dp_shard) == expected
    assert d.world_size == cfg.cluster.nproc_per_node  # ep adds no ranks
