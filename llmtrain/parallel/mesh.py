"""The named DeviceMesh every parallelism hangs from."""

from __future__ import annotations

from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from llmtrain.parallel.layout import ParallelDims

MESH_DIMS = ("dp_replicate", "dp_shard", "pp", "tp")


class Meshes:
    """The 4-D mesh (dp_replicate, dp_shard, pp, tp), built even when only dp > 1 so every layout goes through
    the same code: `dp_2d`, its (replicate, shard) data-parallel part, is FSDP2's mesh; `dp`, the ranks reading
    different samples, cuts the data; `batch`, the ranks holding different tokens, averages the loss.

    With context parallel (cp > 1) the cp ranks share each sample and the parameters, so they are folded into the
    world's data-parallel dimensions (the innermost cp ranks of dp_shard under zero 2/3, where FSDP2 shards over
    dp_shard x cp; of dp_replicate under zero=0, whose shard group is 1), and an unflattened copy of the world
    names them apart: `cp` the ranks of one sample, `dp` the others.

    With expert parallel (ep > 1) the innermost ep ranks of dp_shard (of dp_replicate under zero=0) form the `ep`
    mesh that splits the experts, and `expert_dp` the (replicate, shard) mesh of the ranks holding the same
    experts, which FSDP2 shards or replicates them over. Both are cut from one unflattened copy of the world mesh:
    FSDP2 needs its mesh and the experts' ep mesh to share a root."""

    def __init__(self, dims: ParallelDims, device_type: str):
        cp = dims.cp
        replicate, shard = (dims.dp_replicate, dims.dp_shard * cp) if dims.zero else (dims.dp_replicate * cp, 1)
        self.world = init_device_mesh(device_type, (replicate, shard, dims.pp, dims.tp), mesh_dim_names=MESH_DIMS)
        self.dp_2d = self.world["dp_replicate", "dp_shard"]
        self.pp = self.world["pp"]
        self.tp = self.world["tp"]
        self.cp: DeviceMesh | None = None
        if cp == 1:
            self.dp = self.dp_2d._flatten("dp")
            self.batch = self.dp
        else:
            self.batch = self.dp_2d._flatten("dp_cp")
            self.dp, self.cp = _context_meshes(self.world, dims)
        self.ep: DeviceMesh | None = None
        self.expert_dp: DeviceMesh | None = None
        if dims.ep > 1:
            self.ep, self.expert_dp = _expert_meshes(self.world, dims)


def _context_meshes(world: DeviceMesh, dims: ParallelDims) -> tuple[DeviceMesh, DeviceMesh]:
    """(dp, cp): the ranks reading different samples, and the ranks sharing this rank's samples."""
    if dims.zero:
        split = world._unflatten("dp_shard", (dims.dp_shard, dims.cp), ("data_shard", "cp"))
        return split["dp_replicate", "data_shard"]._flatten("dp"), split["cp"]
    split = world._unflatten("dp_replicate", (dims.dp_replicate, dims.cp), ("data_replicate", "cp"))
    return split["data_replicate", "dp_shard"]._flatten("dp"), split["cp"]


def _expert_meshes(world: DeviceMesh, dims: ParallelDims) -> tuple[DeviceMesh, DeviceMesh]:
    if dims.zero:
        split = world._unflatten("dp_shard", (dims.dp_shard // dims.ep, dims.ep), ("expert_shard", "ep"))
        return split["ep"], split["dp_replicate", "expert_shard"]
    split = world._unflatten("dp_replicate", (dims.dp // dims.ep, dims.ep), ("expert_replicate", "ep"))
    return split["ep"], split["expert_replicate", "dp_shard"]


def build_mesh(dims: ParallelDims, device_type: str) -> Meshes:
    return Meshes(dims, device_type)
