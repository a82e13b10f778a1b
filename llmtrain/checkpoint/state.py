"""Model and optimizer as DCP `Stateful` objects: torch.distributed.checkpoint.state_dict keys both by parameter
name (DTensor shards stay shards, which DCP reshards on load for another layout), and DCP flattens the nested dicts
into keys like model.layers.0.mlp.fc.weight and optim.layers.0.mlp.fc.weight.exp_avg."""

from __future__ import annotations

import torch
import torch.distributed.checkpoint.state_dict as dsd
from torch import nn
from torch.distributed.checkpoint.stateful import Stateful
from torch.distributed.fsdp import FSDPModule

from llmtrain.parallel.build import TIED_COPY, TIED_SOURCE
from llmtrain.parallel.float8 import plain_weights

SHARDED = dsd.StateDictOptions(full_state_dict=False)  # each rank's own shards


def as_one_module(parts: list[nn.Module]) -> nn.Module:
    """The pipeline stages a rank holds as one module with the model's names, so that its one optimizer maps to
    names. Layers are keyed by global index: the stages' layer dicts merge without clashes."""
    if len(parts) == 1:
        return parts[0]
    whole = nn.Module()
    whole.layers = nn.ModuleDict({i: layer for part in parts for i, layer in part.layers.items()})
    for name, child in ((n, c) for part in parts for n, c in part.named_children() if n != "layers"):
        whole.add_module(name, child)
    return whole


def ties_head(parts: list[nn.Module]) -> bool:
    """Whether the model's head is its token embedding (GPT-2, a tied Llama) rather than a weight of its own."""
    return parts[0].args.tie_embeddings


def to_saved(live: dict, tied: bool = True) -> dict:
    """A tied head (the token embedding, or on a last pipeline stage a copy kept equal to it) is saved once, under
    the embedding's name, so a checkpoint looks the same whichever stages a rank held. An untied head is a
    parameter like any other."""
    if not tied:
        return live
    saved = {name: value for name, value in live.items() if name != TIED_COPY}
    if TIED_COPY in live:
        saved.setdefault(TIED_SOURCE, live[TIED_COPY])
    return saved


def from_saved(saved: dict, live: dict, copy=lambda value: value, tied: bool = True) -> dict:
    """to_saved's reverse for this rank's entries `live`: a tied head takes the embedding's entry (its own `copy`)."""
    if tied and TIED_COPY in live:
        saved = dict(saved, **{TIED_COPY: copy(saved[TIED_SOURCE])})
        if TIED_SOURCE not in live:
            del saved[TIED_SOURCE]
    return saved


class ModelState(Stateful):
    def __init__(self, parts: list[nn.Module]):
        self.module, self.tied = as_one_module(parts), ties_head(parts)

    def state_dict(self) -> dict:
        return to_saved(plain_weights(dsd.get_model_state_dict(self.module, options=SHARDED)), self.tied)

    def load_state_dict(self, state: dict) -> None:
        live = dsd.get_model_state_dict(self.module, options=SHARDED)
        dsd.set_model_state_dict(self.module, from_saved(state, live, tied=self.tied), options=SHARDED)


class OptimizerState(Stateful):
    """The optimizer's per-parameter state (AdamW: step, exp_avg, exp_avg_sq). Not its param_groups: the
    hyperparameters come from the config, and the schedule sets the lr every step."""

    def __init__(self, parts: list[nn.Module], optimizer: torch.optim.Optimizer, for_load: bool = False):
        self.parts, self.module, self.optimizer = parts, as_one_module(parts), optimizer
        self.tied = ties_head(parts)
        if for_load:
            _create_state(optimizer)

    def _live(self) -> dict:
        # After a no-grad forward (evaluation) FSDP2 leaves the unsharded parameters registered; the optimizer
        # holds the sharded ones, which get_optimizer_state_dict looks up on the modules.
        for module in (m for part in self.parts for m in part.modules() if isinstance(m, FSDPModule)):
            module.reshard()
        return dsd.get_optimizer_state_dict(self.module, self.optimizer, options=SHARDED)

    def state_dict(self) -> dict:
        if not self.optimizer.state:
            return {}  # every step so far was skipped (fp16 overflow): get_optimizer_state_dict would take one
        return to_saved(self._live()["state"], self.tied)

    def load_state_dict(self, state: dict) -> None:
        live = self._live()
        state = from_saved(state, live["state"], lambda fields: {k: v.clone() for k, v in fields.items()},
                           self.tied)
        dsd.set_optimizer_state_dict(self.module, self.optimizer, {"state": state,
                                                                   "param_groups": live["param_groups"]},
                                     options=SHARDED)


@torch.no_grad()
def _create_state(optimizer: torch.optim.Optimizer) -> None:
    """Optimizers create their state in their first step, and DCP loads into existing tensors: take a step that
    changes nothing (zero gradients, lr 0, hyperparameters put back). get_optimizer_state_dict would take one
    too, but ends it with zero_grad(set_to_none=True), which apex's FusedAdam does not accept."""
    if optimizer.state:
        return
    hyperparameters = [dict(group) for group in optimizer.param_groups]
    for group in optimizer.param_groups:
        group["lr"] = 0.0
        for p in group["params"]:
            p.grad = torch.zeros_like(p)
    optimizer.step()
    for group, before in zip(optimizer.param_groups, hyperparameters):
        for p in group["params"]:
            p.grad = None
        group.clear()
        group.update(before)  # apex counts steps per group: its count starts again from the loaded state
