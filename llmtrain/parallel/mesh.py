"""The named DeviceMesh every parallelism hangs from."""

from __future__ import annotations

from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from llmtrain.parallel.layout import ParallelDims

MESH_DIMS = ("dp_replicate", "dp_shard", "pp", "tp")


class Meshes:
    """The 4-D mesh (dp_replicate, dp_shard, pp, tp), built even when only dp > 1 so every layout goes through
    the same code, plus the flattened 'dp' mesh over all data-parallel ranks (loss averaging, data sharding).

    With expert parallel (ep > 1) the innermost ep ranks of dp_shard (of dp_replicate under zero=0, whose shard
    group is 1) form the `ep` mesh that splits the experts, and `expert_dp` the (replicate, shard) mesh of the
    ranks holding the same experts, which FSDP2 shards or replicates them over. Both are cut from one unflattened
    copy of the world mesh: FSDP2 needs its mesh and the experts' ep mesh to share a root."""

    def __init__(self, dims: ParallelDims, device_type: str):
        self.world = init_device_mesh(device_type, (dims.dp_replicate, dims.dp_shard, dims.pp, dims.tp),
                                      mesh_dim_names=MESH_DIMS)
        self.dp_2d = self.world["dp_replicate", "dp_shard"]
        self.dp = self.dp_2d._flatten("dp")
        self.pp = self.world["pp"]
        self.tp = self.world["tp"]
        self.ep: DeviceMesh | None = None
        self.expert_dp: DeviceMesh | None = None
        if dims.ep > 1:
            self.ep, self.expert_dp = _expert_meshes(self.world, dims)


def _expert_meshes(world: DeviceMesh, dims: ParallelDims) -> tuple[DeviceMesh, DeviceMesh]:
    if dims.zero:
        split = world._unflatten("dp_shard", (dims.dp_shard // dims.ep, dims.ep), ("expert_shard", "ep"))
        return split["ep"], split["dp_replicate", "expert_shard"]
    split = world._unflatten("dp_replicate", (dims.dp // dims.ep, dims.ep), ("expert_replicate", "ep"))
    return split["ep"], split["expert_replicate", "dp_shard"]


def build_mesh(dims: ParallelDims, device_type: str) -> Meshes:
    return Meshes(dims, device_type)
