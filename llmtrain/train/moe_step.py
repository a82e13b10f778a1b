"""A mixture-of-experts model's bookkeeping around each optimizer step.

Before the step: every MoE block's statistics start from zero, and its `aux_loss_scale` is set to the factor the
LM loss is multiplied by before backward, so the auxiliary losses reach the gradients as if added to the loss.
After it: one all-reduce of a flat table (a row per sparse layer: tokens per expert, aux and z-loss sums, forward
calls) over the data-parallel and pipeline ranks (each pipeline stage fills the rows of its own layers; tensor-
parallel ranks compute the same numbers and are not summed), then the router bias balancing from the summed token
counts, and on logged steps the metrics row's MoE fields. Without bias balancing the reduction runs on logged steps
only. Under expert parallel (ep > 1) the row also says how the routed pairs fell on the ep ranks, from the same
table: no more communication.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn


def layer_metrics(layers: list[int], table: list[list[float]], n_experts: int, ep: int = 1) -> dict:
    """The metrics row's MoE fields from the reduced table (rows in the order of `layers`); with ep > 1 also the
    expert-parallel ranks' load (ep_metrics)."""
    tokens = [[int(round(v)) for v in row[:n_experts]] for row in table]
    calls = [max(row[n_experts + 2], 1.0) for row in table]
    aux = [row[n_experts] / c for row, c in zip(table, calls)]
    z = [row[n_experts + 1] / c for row, c in zip(table, calls)]
    # Busiest expert over the mean, as max x E / total: exactly E when one expert takes every token.
    load = [max(t) * n_experts / sum(t) if sum(t) else 0.0 for t in tokens]
    out = {"aux_loss": sum(aux) / len(aux), "router_z_loss": sum(z) / len(z), "moe_layers": list(layers),
           "expert_load": load, "experts_idle": [t.count(0) for t in tokens], "expert_tokens": tokens}
    if ep > 1:
        out.update(ep_metrics(tokens, ep))
    return out


def ep_metrics(tokens: list[list[int]], ep: int) -> dict:
    """Per sparse layer, the token-expert pairs each expert-parallel rank received over the step, summed over the
    ep groups (rank j holds experts [j E/ep, (j+1) E/ep), so it is those experts' tokens), and the busiest rank's
    over the mean: 1.0 is balanced, ep when one rank gets every pair."""
    per = len(tokens[0]) // ep
    ranks = [[sum(t[j * per:(j + 1) * per]) for j in range(ep)] for t in tokens]
    load = [max(r) * ep / sum(r) if sum(r) else 0.0 for r in ranks]
    return {"ep_tokens": ranks, "ep_load": load}


def _reduce_group(mesh, dims) -> dist.ProcessGroup | None:
    """The ranks that hold different tokens (dp, cp) or different layers (pp) at this rank's tp coordinate."""
    if dims.dp * dims.cp > 1 and dims.pp > 1:
        names = tuple(n for n in mesh.world.mesh_dim_names if n != "tp")  # adjacent: tp is the last dimension
        return mesh.world[names]._flatten("tokens_pp").get_group()
    if dims.dp * dims.cp > 1:
        return mesh.batch.get_group()
    if dims.pp > 1:
        return mesh.pp.get_group()
    return None


class MoEStep:
    def __init__(self, parts: list[nn.Module], layers: list[int], n_experts: int, bias_update_rate: float,
                 group: dist.ProcessGroup | None, device: torch.device, ep: int = 1):
        from llmtrain.model.moe import moe_modules

        self.layers = layers  # global indices of the sparse layers, the same on every rank
        self.n_experts = n_experts
        self.ep = ep  # expert-parallel ranks splitting each sparse layer's experts (1: none)
        self.bias_update_rate = bias_update_rate
        self.group = group
        self.device = device
        row = {layer: i for i, layer in enumerate(layers)}
        # (table row, block) for the sparse blocks this rank holds; layers' keys are global indices.
        self.local = [(row[int(key)], m) for part in parts for key, block in part.layers.items()
                      for m in moe_modules(block)]

    @classmethod
    def build(cls, cfg, parts: list[nn.Module], mesh, dims, device: torch.device) -> "MoEStep | None":
        """None for a dense model (model.moe null)."""
        from llmtrain.model.moe.args import MoEArgs

        args = MoEArgs.from_config(cfg.model)
        if args is None:
            return None
        layers = [i for i in range(cfg.model.n_layers) if args.is_sparse(i)]
        if not layers:
            return None
        return cls(parts, layers, args.n_experts, args.bias_update_rate, _reduce_group(mesh, dims), device,
                   ep=dims.ep)

    def start(self, loss_factor: float) -> None:
        """Before a step's first forward: `loss_factor` is what the LM loss is multiplied by before backward."""
        for _, m in self.local:
            m.reset_stats()
            m.aux_loss_scale.fill_(loss_factor)

    @torch.no_grad()
    def finish(self, logged: bool, skipped: bool) -> dict | None:
        """After the optimizer step: the bias balancing (not after a skipped step), and on a logged step the
        metrics row's MoE fields (None otherwise)."""
        balance = self.bias_update_rate > 0 and not skipped
        if not (logged or balance):
            return None
        table = self._reduced_table()
        if balance:
            for row, m in self.local:
                m.update_bias(table[row, :self.n_experts])
        return layer_metrics(self.layers, table.cpu().tolist(), self.n_experts, self.ep) if logged else None

    def _reduced_table(self) -> torch.Tensor:
        e = self.n_experts
        # float64: token counts stay exact integers far past any step's count.
        table = torch.zeros(len(self.layers), e + 3, dtype=torch.float64, device=self.device)
        for row, m in self.local:
            table[row, :e] = m.tokens_per_expert.to(torch.float64)
            table[row, e] = m.aux_sum.to(torch.float64)
            table[row, e + 1] = m.z_sum.to(torch.float64)
            table[row, e + 2] = m.calls.to(torch.float64)
        if self.group is not None:
            dist.all_reduce(table, group=self.group)
        return table
