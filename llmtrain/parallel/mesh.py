"""The named DeviceMesh every parallelism hangs from."""

from __future__ import annotations

from torch.distributed.device_mesh import init_device_mesh

from llmtrain.parallel.layout import ParallelDims

MESH_DIMS = ("dp_replicate", "dp_shard", "pp", "tp")


class Meshes:
    """The 4-D mesh (dp_replicate, dp_shard, pp, tp), built even when only dp > 1 so every layout goes through
    the same code, plus the flattened 'dp' mesh over all data-parallel ranks (loss averaging, data sharding)."""

    def __init__(self, dims: ParallelDims, device_type: str):
        self.world = init_device_mesh(device_type, (dims.dp_replicate, dims.dp_shard, dims.pp, dims.tp),
                                      mesh_dim_names=MESH_DIMS)
        self.dp_2d = self.world["dp_replicate", "dp_shard"]
        self.dp = self.dp_2d._flatten("dp")
        self.pp = self.world["pp"]
        self.tp = self.world["tp"]


def build_mesh(dims: ParallelDims, device_type: str) -> Meshes:
    return Meshes(dims, device_type)
