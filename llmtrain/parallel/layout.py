"""The parallel layout as plain numbers: degrees and each rank's (dp, cp, pp, tp) coordinates. No torch.distributed,
so the launcher's --dry-run and the planner can use it without a process group."""

from __future__ import annotations

from dataclasses import dataclass

from llmtrain.config.schema import V_SHAPED_SCHEDULES


@dataclass(frozen=True)
class ParallelDims:
    dp: int
    tp: int
    pp: int
    # dp = dp_replicate x dp_shard: parameters/grads/optimizer are sharded inside a dp_shard group.
    dp_shard: int
    zero: int
    # Expert parallel, carved from dp: each group of `ep` consecutive dp ranks splits a sparse block's experts.
    ep: int = 1
    # Context parallel: cp ranks (between dp and pp in rank order) share each sample, each holding 1/cp of it.
    cp: int = 1

    @property
    def dp_replicate(self) -> int:
        return self.dp // self.dp_shard

    @property
    def world_size(self) -> int:
        return self.dp * self.cp * self.pp * self.tp

    @classmethod
    def from_config(cls, cfg) -> "ParallelDims":
        p = cfg.parallel
        if p.zero == 0:
            dp_shard = 1  # replicate: every dp rank keeps everything, gradients are all-reduced
        else:
            dp_shard = p.dp_shard or p.dp
        return cls(dp=p.dp, tp=p.tp, pp=p.pp, dp_shard=dp_shard, zero=p.zero, ep=p.get("ep", 1),
                   cp=p.get("cp", 1))

    @property
    def expert_dp(self) -> int:
        """The ranks that hold the same experts (dp / ep): they replicate or ZeRO-shard them as dp does the
        rest."""
        return self.dp // self.ep

    @property
    def expert_dp_shard(self) -> int:
        """The ZeRO shard group of the experts: dp_shard / ep (zero > 0), else 1."""
        return self.dp_shard // self.ep if self.zero else 1

    @property
    def degrees(self) -> str:
        """'dp=4 tp=1 pp=1', with ' ep=2' under expert parallel: how log lines name the layout."""
        return (f"dp={self.dp} tp={self.tp} pp={self.pp}" + (f" cp={self.cp}" if self.cp > 1 else "")
                + (f" ep={self.ep}" if self.ep > 1 else ""))

    def coords(self, rank: int) -> dict[str, int]:
        """Rank order is (dp_replicate, dp_shard, cp, pp, tp) with tp fastest, so a TP group sits on one node's
        fast links, then pipeline stages, then the ranks sharing a sequence, then data-parallel replicas across
        nodes."""
        tp = rank % self.tp
        pp = (rank // self.tp) % self.pp
        cp = (rank // (self.tp * self.pp)) % self.cp
        dp = rank // (self.tp * self.pp * self.cp)
        return {"rank": rank, "dp": dp, "dp_replicate": dp // self.dp_shard, "dp_shard": dp % self.dp_shard,
                "cp": cp, "pp": pp, "tp": tp, "ep": dp % self.ep}


def layers_per_stage(n_layers: int, num_stages: int, explicit: list[int] | None) -> list[int]:
    if explicit:
        return list(explicit)
    return [n_layers // num_stages] * num_stages


def stage_ids(pp_rank: int, pp: int, virtual_stages: int, schedule: str) -> list[int]:
    """Global stage indices held by pp rank `pp_rank`."""
    num_stages = pp * virtual_stages
    if schedule in V_SHAPED_SCHEDULES:
        return [pp_rank, num_stages - 1 - pp_rank]
    return [pp_rank + k * pp for k in range(virtual_stages)]


def stage_owner(stage: int, pp: int, virtual_stages: int, schedule: str) -> int:
    for r in range(pp):
        if stage in stage_ids(r, pp, virtual_stages, schedule):
            return r
    raise ValueError(f"stage {stage} has no owner")
