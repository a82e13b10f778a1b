"""The parallel layout as plain numbers: degrees and each rank's (dp, pp, tp) coordinates. No torch.distributed,
so the launcher's --dry-run and the planner can use it without a process group."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ParallelDims:
    dp: int
    tp: int
    pp: int
    # dp = dp_replicate x dp_shard: parameters/grads/optimizer are sharded inside a dp_shard group.
    dp_shard: int
    zero: int

    @property
    def dp_replicate(self) -> int:
        return self.dp // self.dp_shard

    @property
    def world_size(self) -> int:
        return self.dp * self.pp * self.tp

    @classmethod
    def from_config(cls, cfg) -> "ParallelDims":
        p = cfg.parallel
        if p.zero == 0:
            dp_shard = 1  # replicate: every dp rank keeps everything, gradients are all-reduced
        else:
            dp_shard = p.dp_shard or p.dp
        return cls(dp=p.dp, tp=p.tp, pp=p.pp, dp_shard=dp_shard, zero=p.zero)

    def coords(self, rank: int) -> dict[str, int]:
        """Rank order is (dp_replicate, dp_shard, pp, tp) with tp fastest, so a TP group sits on one node's
        fast links, then pipeline stages, then data-parallel replicas across nodes."""
        tp = rank % self.tp
        pp = (rank // self.tp) % self.pp
        dp = rank // (self.tp * self.pp)
        return {"rank": rank, "dp": dp, "dp_replicate": dp // self.dp_shard, "dp_shard": dp % self.dp_shard,
                "pp": pp, "tp": tp}
