"""The head's weight and hidden states as plain tensors for a loss that runs its own matmuls.

Under tensor parallel the head's weight is a vocabulary-sharded DTensor (Shard(0) over the tp mesh) and the hidden
states arrive replicated, or sequence-sharded under sequence parallel. The loss needs every token on every rank and
this rank's vocabulary rows; the hidden states' gradient it returns is this shard's part, which DTensor sums over
tp on the way back (an all-reduce, or a reduce-scatter to the sequence shards)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Partial, Replicate


@dataclass
class LocalHead:
    hidden: torch.Tensor  # (tokens, d): every token of the micro-batch
    weight: torch.Tensor  # (vocab rows here, d)
    group: dist.ProcessGroup | None  # the tp group, or None when the weight is whole
    vocab_start: int  # the first vocabulary row held here


def local_head(hidden: torch.Tensor, weight: torch.Tensor) -> LocalHead:
    if not isinstance(weight, DTensor):
        if isinstance(hidden, DTensor):
            hidden = hidden.full_tensor()
        return LocalHead(hidden.flatten(0, -2), weight, None, 0)
    mesh = weight.device_mesh
    if mesh.ndim != 1 or weight.placements[0].is_shard(0) is False:
        raise ValueError(f"chunked loss: the head's weight must be vocabulary-sharded over one mesh dimension "
                         f"(got {weight.placements} over {mesh.ndim} dimensions)")
    if not isinstance(hidden, DTensor):
        hidden = DTensor.from_local(hidden, mesh, [Replicate()], run_check=False)
    hidden = hidden.redistribute(mesh, [Replicate()]).to_local(grad_placements=[Partial()])
    rows, ranks, rank = weight.shape[0], mesh.size(), mesh.get_local_rank()
    per_rank = -(-rows // ranks)  # Shard(0) splits like torch.chunk: the last ranks may hold fewer rows
    return LocalHead(hidden.flatten(0, -2), weight.to_local(), mesh.get_group(), min(rank * per_rank, rows))
