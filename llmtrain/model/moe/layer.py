"""The mixture-of-experts block: a sparse layer's `mlp`. No parallelism code: tensor parallel computes it whole on
every rank ("replicated"); expert parallel splits `experts` over ranks from outside (parallel/expert_parallel.py).

forward(x (b, t, d)) -> (b, t, d): router logits in fp32, top_k experts per token (router.py), the token-expert
pairs stably sorted by expert (dispatch.py), the experts run grouped or in a loop (experts.py, grouped.py), each
token's k outputs weighted and summed, the shared experts added. Dropless: every pair is computed.

Buffers: `router_bias` [E] fp32 (persistent; only bias balancing moves it), `aux_loss_scale` (the gradient the
weighted auxiliary loss gets, set by the trainer), and statistics accumulated over the forwards since
reset_stats(), activation recompute's second forward not counted: `tokens_per_expert` [E] routed pairs,
`aux_sum` (load-balancing loss / top_k, so 1.0 is perfectly balanced), `z_sum` (router z-loss), `calls`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from llmtrain.errors import ConfigError
from llmtrain.model.moe.args import MoEArgs, grouped_mm_width_problem
from llmtrain.model.moe.aux_loss import inject_aux_loss, load_balancing_loss, z_loss
from llmtrain.model.moe.dispatch import combine, sort_by_expert, sorted_tokens
from llmtrain.model.moe.experts import Experts
from llmtrain.model.moe.grouped import use_grouped_mm
from llmtrain.model.moe.recompute import recomputing
from llmtrain.model.moe.router import route
from llmtrain.model.moe.shared import SharedExperts


class MoE(nn.Module):
    def __init__(self, d_model: int, args: MoEArgs, layer: int):
        super().__init__()
        if args.grouped_mm == "on" and (problem := grouped_mm_width_problem(d_model, args.ffn)):
            raise ConfigError("model.moe.grouped_mm", f"on, but {problem}")
        self.args, self.layer = args, layer
        self.router = nn.Linear(d_model, args.n_experts, bias=False)
        self.experts = Experts(args.n_experts, d_model, args.ffn)
        self.shared = SharedExperts(d_model, args.shared_ffn) if args.n_shared_experts else None
        e = args.n_experts
        self.register_buffer("router_bias", torch.zeros(e, dtype=torch.float32))
        self.register_buffer("aux_loss_scale", torch.ones((), dtype=torch.float32), persistent=False)
        self.register_buffer("tokens_per_expert", torch.zeros(e, dtype=torch.int64), persistent=False)
        self.register_buffer("aux_sum", torch.zeros((), dtype=torch.float32), persistent=False)
        self.register_buffer("z_sum", torch.zeros((), dtype=torch.float32), persistent=False)
        self.register_buffer("calls", torch.zeros((), dtype=torch.int64), persistent=False)
        # Set from outside when other ranks hold the rest of each sequence (context parallel): a differentiable
        # sum over them, so the balancing loss sees the whole micro-batch's tokens as one process does.
        self.sequence_sum = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        tokens = x.reshape(-1, d)
        a = self.args
        logits = F.linear(tokens.float(), self.router.weight.float())
        routing = route(logits, a.top_k, a.score_func, a.norm_topk_prob, self.router_bias)
        dispatch = sort_by_expert(routing.experts, a.n_experts)
        sorted_x = sorted_tokens(tokens, dispatch, a.top_k)
        grouped = use_grouped_mm(a.grouped_mm, sorted_x, (self.experts.gate, self.experts.proj))
        out = combine(self.experts(sorted_x, dispatch.counts, grouped), dispatch, routing.weights.to(x.dtype))
        if self.shared is not None:
            out = out + self.shared(tokens)
        balance = load_balancing_loss(routing.probs, routing.experts, self.sequence_sum)
        z = z_loss(logits)
        self._count(dispatch.counts, balance, z)
        if torch.is_grad_enabled() and (a.router_aux_loss_coef or a.router_z_loss_coef):
            out = inject_aux_loss(out, a.router_aux_loss_coef * balance + a.router_z_loss_coef * z,
                                  self.aux_loss_scale)
        return out.view(b, t, d)

    @torch.no_grad()
    def _count(self, counts: torch.Tensor, balance: torch.Tensor, z: torch.Tensor) -> None:
        if recomputing():
            return
        self.tokens_per_expert += counts
        self.aux_sum += balance.detach() / self.args.top_k
        self.z_sum += z.detach()
        self.calls += 1

    @torch.no_grad()
    def reset_stats(self) -> None:
        for buf in (self.tokens_per_expert, self.aux_sum, self.z_sum, self.calls):
            buf.zero_()

    @torch.no_grad()
    def reset_buffers(self) -> None:
        """After a meta-device model is materialized (and on a fresh start): no bias, scale 1, no statistics."""
        self.router_bias.zero_()
        self.aux_loss_scale.fill_(1.0)
        self.reset_stats()

    @torch.no_grad()
    def update_bias(self, global_tokens_per_expert: torch.Tensor) -> None:
        """Bias balancing (model.moe.bias_update_rate > 0): after a step, from its token counts over all ranks,
        raise the bias of the experts below the mean load and lower it for those above."""
        rate = self.args.bias_update_rate
        if rate <= 0:
            return
        load = global_tokens_per_expert.to(device=self.router_bias.device, dtype=torch.float32)
        self.router_bias += rate * torch.sign(load.mean() - load)


def moe_modules(module: nn.Module) -> list[MoE]:
    """The MoE blocks inside `module` (a model, a pipeline stage, one block), in module order."""
    return [m for m in module.modules() if isinstance(m, MoE)]
