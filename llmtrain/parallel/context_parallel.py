"""Context parallel: each sequence split over the cp ranks of a group, attention exact over the whole sequence.

The sequence is cut into 2 x cp equal chunks and rank r holds chunks r and 2 cp - 1 - r (the head-tail balance:
under a causal mask a late chunk attends to more keys than an early one, so each rank gets one of each and the
same work). Every layer's attention all-gathers the keys and values of the whole sequence over the group (Llama
3's form: grouped-query attention keeps them small; the same on gloo and NCCL, so CPU tests run it), restores
sequence order, and attends each local query chunk to the keys up to its own end with a causal mask aligned to
the chunk's place (torch's causal_lower_right, which the fused kernels take). The backward of the gather
reduce-scatters the keys' and values' gradients back to their ranks.

The model does not know: its attention core is swapped for this one, the modules that read positions (rotary
q/k, GPT-2's learned embedding) are given the rank's positions, and a mixture of experts' balancing loss is given
a sum over the group (its token shares and mean probabilities are then the whole micro-batch's: every rank
computes the same loss, and FSDP2's mean over the group of each rank's gradient, which the sum's backward makes
cp times its share, is the whole gradient). The trainer slices each micro-batch's inputs and
targets to the same positions; the loss of equal shares averages to the whole sequence's over the dp x cp ranks.
"""

from __future__ import annotations

import functools

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.distributed.nn.functional as dist_nn
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.nn.attention.bias import causal_lower_right

from llmtrain.model.moe import moe_modules


def chunk_bounds(seq_len: int, cp: int, rank: int) -> list[tuple[int, int]]:
    """[start, end) of the two chunks rank `rank` holds, in the order it holds them."""
    size = seq_len // (2 * cp)
    return [(rank * size, (rank + 1) * size), ((2 * cp - 1 - rank) * size, (2 * cp - rank) * size)]


def rank_positions(seq_len: int, cp: int, rank: int) -> torch.Tensor:
    """The sequence positions of the tokens rank `rank` holds, in its order."""
    return torch.cat([torch.arange(start, end) for start, end in chunk_bounds(seq_len, cp, rank)])


def sequence_order(seq_len: int, cp: int) -> torch.Tensor:
    """The permutation that puts the ranks' tokens, gathered rank after rank, back in sequence order."""
    gathered = torch.cat([rank_positions(seq_len, cp, r) for r in range(cp)])
    return torch.argsort(gathered)


class ContextParallelCore:
    """An attention core (q, k, v) -> y over this rank's two chunks, with keys and values from the whole group."""

    def __init__(self, mesh: DeviceMesh, seq_len: int, dropout: float, module: nn.Module):
        self.group = mesh.get_group()
        self.cp, self.rank = mesh.size(), mesh.get_local_rank()
        self.bounds = chunk_bounds(seq_len, self.cp, self.rank)
        self.order = sequence_order(seq_len, self.cp)
        self.dropout, self.module = dropout, module

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        k, v = (self._whole(t) for t in (k, v))
        outs, start = [], 0
        p = self.dropout if self.module.training else 0.0
        for first, end in self.bounds:
            length = end - first
            mask = causal_lower_right(length, end)
            outs.append(F.scaled_dot_product_attention(
                q[:, :, start:start + length], k[:, :, :end], v[:, :, :end], attn_mask=mask, dropout_p=p,
                enable_gqa=q.shape[1] != k.shape[1]))
            start += length
        return torch.cat(outs, dim=2)

    def _whole(self, t: torch.Tensor) -> torch.Tensor:
        """(b, heads, local, d) -> (b, heads, seq_len, d) in sequence order."""
        gathered = gather_sequence(t.permute(2, 0, 1, 3), self.group)  # torch gathers along dim 0 only
        if self.order.device != t.device:
            self.order = self.order.to(t.device)  # once, not a host-to-device copy per layer
        return gathered.index_select(0, self.order).permute(1, 2, 0, 3)


def gather_sequence(t: torch.Tensor, group) -> torch.Tensor:
    """Every rank's `t` concatenated along dim 0, rank after rank; backward reduce-scatters the gradient."""
    return funcol.wait_tensor(funcol.all_gather_single_autograd(t.contiguous(), 0, group))


def apply_context_parallel(model: nn.Module, cp_mesh: DeviceMesh, seq_len: int) -> None:
    """Swap every block's attention core (before recompute, which then wraps this core), and give every mixture
    of experts the sum over the cp group its balancing loss takes over the whole sequence."""
    group = cp_mesh.get_group()
    for block in model.layers.values():
        attn = block.attn
        attn.core = ContextParallelCore(cp_mesh, seq_len, getattr(attn, "dropout", 0.0), attn)
    for moe in moe_modules(model):
        moe.sequence_sum = functools.partial(_sum_over, group=group)


def _sum_over(t: torch.Tensor, group) -> torch.Tensor:
    # Differentiable: every rank gets the sum, and in backward every rank's gradient is summed back.
    return dist_nn.all_reduce(t, op=dist.ReduceOp.SUM, group=group)


def mesh_positions(cp_mesh: DeviceMesh | None, seq_len: int) -> torch.Tensor | None:
    """This rank's positions in its cp group (None without context parallel): which tokens of every sample the
    trainer hands it."""
    return None if cp_mesh is None else rank_positions(seq_len, cp_mesh.size(), cp_mesh.get_local_rank())


def set_token_positions(model: nn.Module, cp_mesh: DeviceMesh, seq_len: int, device: torch.device) -> None:
    """Give every module that reads positions this rank's (after the model is materialized on `device`)."""
    positions = mesh_positions(cp_mesh, seq_len).to(device)
    for module in model.modules():
        if hasattr(module, "token_positions"):
            module.token_positions = positions
