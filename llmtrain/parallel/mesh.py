"""The named DeviceMesh every parallelism hangs from."""

from __future__ import annotations

from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from llmtrain.parallel.layout import ParallelDims

MESH_DIMS = ("dp_replicate", "dp_shard", "pp", "tp")


class Meshes:
    """The 4-D mesh (dp_replicate, dp_shard, pp, tp), built even when only dp > 1 so every layout goes through
    the same code, plus the flattened 'dp' mesh over all data-parallel ranks (data sharding).

    With context parallel (cp > 1) a `cp` dimension sits between dp and pp: its ranks share each sample, so
    parameters are replicated or ZeRO-sharded over dp x cp (`dp_2d`, FSDP2's mesh) and the loss is averaged over
    `batch`, the flattened dp x cp ranks, while the data is cut by `dp` alone. Under zero=0 (shard group 1) the cp
    dimension is listed before dp_shard, which places the ranks the same, so that the replicated ranks flatten
    into one adjacent run; under zero 2/3 after it, so that FSDP2's shard group is dp_shard x cp.

    With expert parallel (ep > 1) the innermost ep ranks of dp_shard (of dp_replicate under zero=0) form the `ep`
    mesh that splits the experts, and `expert_dp` the (replicate, shard) mesh of the ranks holding the same
    experts, which FSDP2 shards or replicates them over. Both are cut from one unflattened copy of the world mesh:
    FSDP2 needs its mesh and the experts' ep mesh to share a root."""

    def __init__(self, dims: ParallelDims, device_type: str):
        sizes = {"dp_replicate": dims.dp_replicate, "dp_shard": dims.dp_shard, "cp": dims.cp, "pp": dims.pp,
                 "tp": dims.tp}
        if dims.cp == 1:
            names = MESH_DIMS
        elif dims.zero:
            names = ("dp_replicate", "dp_shard", "cp", "pp", "tp")
        else:
            names = ("dp_replicate", "cp", "dp_shard", "pp", "tp")
        self.world = init_device_mesh(device_type, tuple(sizes[n] for n in names), mesh_dim_names=names)
        self.pp = self.world["pp"]
        self.tp = self.world["tp"]
        self.cp: DeviceMesh | None = None
        if dims.cp == 1:
            self.dp_2d = self.world["dp_replicate", "dp_shard"]
            self.dp = self.dp_2d._flatten("dp")
            self.batch = self.dp
        else:
            self.cp = self.world["cp"]
            self.dp = (self.world["dp_replicate", "dp_shard"] if dims.zero else self.world["dp_replicate"])._flatten("dp")
            self.batch = self.world["dp_replicate", "dp_shard", "cp"]._flatten("dp_cp") if dims.zero else \
                self.world["dp_replicate", "cp", "dp_shard"]._flatten("dp_cp")
            if dims.zero:
                self.world["dp_shard", "cp"]._flatten("dp_shard_cp")
                self.dp_2d = self.world["dp_replicate", "dp_shard_cp"]
            else:
                self.world["dp_replicate", "cp"]._flatten("dp_replicate_cp")
                self.dp_2d = self.world["dp_replicate_cp", "dp_shard"]
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
