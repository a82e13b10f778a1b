"""Build this rank's share of the model: meta-device GPT or Llama -> pipeline split -> float8 layers (precision=fp8) ->
tensor parallel -> expert and context parallel -> recompute -> compile -> FSDP2 -> materialize on the device -> layout-independent init
(torchtitan's order: float8 before TP, TP before FSDP, init after sharding)."""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
from omegaconf import DictConfig
from torch import nn
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import loss_parallel

from llmtrain.config.derived import Derived, torch_dtype
from llmtrain.loss import check_loss_device, head_loss_for, resolve_loss
from llmtrain.model import build_model, init_parameters
from llmtrain.model.registry import family_of
from llmtrain.parallel.context_parallel import apply_context_parallel, set_token_positions
from llmtrain.parallel.data_parallel import apply_data_parallel
from llmtrain.parallel.expert_parallel import apply_expert_parallel, scale_expert_gradients
from llmtrain.parallel.float8 import Float8Training
from llmtrain.parallel.layout import ParallelDims
from llmtrain.parallel.recompute import apply_recompute
from llmtrain.parallel.mesh import Meshes
from llmtrain.parallel.tensor_parallel import apply_tensor_parallel

TIED_COPY = "head.weight"  # on a last pipeline stage that does not also hold the embedding
TIED_SOURCE = "embed.tok.weight"
CHECKPOINT_PREFIX = "_checkpoint_wrapped_module."  # added by full recompute's checkpoint_wrapper


class ParallelModel:
    """The model parts this rank holds (one, or several pipeline stages) and how to run them."""

    def __init__(self, parts: list[nn.Module], dims: ParallelDims, pipeline=None, stage_ids=(),
                 num_stages: int = 1, tied_group: dist.ProcessGroup | None = None,
                 float8: Float8Training | None = None):
        self.parts = parts
        self.dims = dims
        self.pipeline = pipeline
        self.stage_ids = list(stage_ids)
        self.num_stages = num_stages
        self.tied_group = tied_group
        self.pipeline_loss_scale = 1.0
        self.float8 = float8  # precision=fp8's float8 layers
        self.init_from_note: str | None = None  # what model.init_from loaded, for rank 0's log
        self.has_first_stage = num_stages == 1 or 0 in self.stage_ids
        self.has_last_stage = num_stages == 1 or (num_stages - 1) in self.stage_ids
        # Captured once, now, while FSDP2 has its sharded parameters registered: after a no-grad forward
        # (evaluation) with reshard_after_forward=False the modules hold the unsharded ones until the next
        # backward, and the optimizer and checkpoints must keep addressing the sharded objects.
        self._named = self._collect()

    def _collect(self) -> list[tuple[str, nn.Parameter]]:
        seen, named = set(), []
        for part in self.parts:
            for name, p in part.named_parameters():
                if id(p) not in seen:
                    seen.add(id(p))
                    named.append((name.replace(CHECKPOINT_PREFIX, ""), p))
        return named

    def named_parameters(self):
        """Parameters by their model name (wrapper prefixes removed), each once: the sharded objects the
        optimizer updates."""
        return iter(self._named)

    def parameters(self) -> list[nn.Parameter]:
        return [p for _, p in self.named_parameters()]

    def norm_parameters(self) -> list[nn.Parameter]:
        """Parameters counted in the gradient norm: a tied head copy is the embedding counted twice."""
        if self.tied_group is None:
            return self.parameters()
        return [p for name, p in self.named_parameters() if not self._is_tied_copy(name)]

    def _is_tied_copy(self, name: str) -> bool:
        return name == TIED_COPY and self.num_stages > 1

    def loss_context(self):
        return loss_parallel() if self.dims.tp > 1 else contextlib.nullcontext()

    def set_gradient_sync(self, enabled: bool) -> None:
        for part in self.parts:
            if hasattr(part, "set_requires_gradient_sync"):
                part.set_requires_gradient_sync(enabled)

    def finish_gradients(self) -> None:
        """After a step's last backward, before clipping: the tied copies' sum, the experts' mean over dp."""
        self.sync_tied_weights()
        scale_expert_gradients(self.parts, self.dims.ep)

    @torch.no_grad()
    def sync_tied_weights(self) -> None:
        """Sum the gradients of the embedding and its head copy on the first and last pipeline stages, so both
        copies take the same update (Megatron's embedding group)."""
        if self.tied_group is None:
            return
        tied = [p for name, p in self.named_parameters() if name in (TIED_SOURCE, TIED_COPY)]
        for p in tied:
            # A DTensor grad may come back in another placement than its parameter (e.g. Partial); both ends
            # must hold the same shard before their local tensors are added.
            if isinstance(p.grad, DTensor) and p.grad.placements != p.placements:
                p.grad = p.grad.redistribute(p.device_mesh, p.placements)
        local = [_local(p.grad) for p in tied if p.grad is not None]
        if len(local) == 2:  # both ends on this rank (V-shaped schedules)
            total = local[0] + local[1]
            for g in local:
                g.copy_(total)
        elif len(local) == 1:
            dist.all_reduce(local[0], group=self.tied_group)

    def after_optimizer_step(self) -> None:
        if self.float8 is not None:
            self.float8.after_optimizer_step(self.parts)

    def describe(self) -> str:
        n = sum(p.numel() for p in self.parameters())
        local = sum(_local(p).numel() for p in self.parameters())
        stages = f", pipeline stages {self.stage_ids}" if self.pipeline is not None else ""
        return f"{n:,} parameters on this rank ({local:,} local elements){stages}"


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def build_parallel_model(cfg: DictConfig, dims: ParallelDims, mesh: Meshes, device: torch.device,
                         pretrained=None) -> ParallelModel:
    """The model's parts on this rank, parallelised and initialised; `pretrained` (model.init_from's weights, read
    one tensor at a time by init_parameters) replaces the random initialisation."""
    with torch.device("meta"):
        whole = build_model(cfg.model)
    pp = cfg.parallel
    param_dtype = torch_dtype(cfg.precision.compute_dtype)
    param_dtype = None if param_dtype == torch.float32 else param_dtype
    reduce_dtype = torch_dtype(cfg.precision.reduce_dtype)
    pretrained_note = pretrained.describe() if pretrained is not None else None

    float8 = Float8Training.from_config(cfg, dims)
    float8_styles = float8 is not None and float8.tensor_parallel_styles

    def finish(part: nn.Module) -> nn.Module:
        if float8 is not None:
            float8.convert(part)  # first: TP, recompute, compile and FSDP2 each take the float8 layers as they are
        if dims.tp > 1:
            apply_tensor_parallel(part, family_of(cfg.model), mesh.tp, pp.sequence_parallel, float8_styles)
        if dims.ep > 1:
            apply_expert_parallel(part, mesh.ep)
        if dims.cp > 1:
            apply_context_parallel(part, mesh.cp, cfg.model.seq_len)
        apply_recompute(part, cfg.recompute.mode, cfg.recompute.every)
        if cfg.train.compile:
            for block in part.layers.values():
                block.compile()  # in place: parameter names stay the same
        if cfg.optim.fused == "apex":
            from llmtrain.model.apex_norm import fused_layernorm

            fused_layernorm(part)
        apply_data_parallel(part, mesh.dp_2d, dims, param_dtype, reduce_dtype, mesh.expert_dp)
        part.to_empty(device=device)
        part.tie_weights()
        init_parameters(part, cfg.train.seed, cfg.model.init_std, cfg.model.n_layers, pretrained)
        if dims.cp > 1:
            set_token_positions(part, mesh.cp, cfg.model.seq_len, device)
        if part.head is not None:
            part.head_loss = head_loss if dims.pp == 1 else _as_stage_output(head_loss)
        return part

    loss_name = resolve_loss(cfg.train.loss, device.type, dims.tp, dims.pp)
    check_loss_device(loss_name, device.type)
    head_loss = head_loss_for(loss_name, cfg.train.loss_chunk_tokens)

    if dims.pp == 1:
        model = ParallelModel([finish(whole)], dims, float8=float8)
        model.init_from_note = pretrained_note
        return model

    # Imported here: torch's pipelining imports torch._dynamo, most of a second of every worker's start-up.
    from torch.distributed.pipelining import PipelineStage

    from llmtrain.parallel import pipeline as pp_lib

    num_stages = dims.pp * pp.virtual_stages
    counts = pp_lib.layers_per_stage(cfg.model.n_layers, num_stages, pp.pp_layers)
    pp_rank = mesh.pp.get_local_rank()
    pp_group = mesh.pp.get_group()
    ids = pp_lib.stage_ids(pp_rank, dims.pp, pp.virtual_stages, pp.pp_schedule)
    parts = [finish(pp_lib.make_stage_module(whole, s, counts)) for s in ids]
    stages = [PipelineStage(part, s, num_stages, device, group=pp_group) for part, s in zip(parts, ids)]
    tied_group = _tied_group(mesh, dims, pp) if whole.args.tie_embeddings else None
    model = ParallelModel(parts, dims, None, ids, num_stages, tied_group, float8)
    model.init_from_note = pretrained_note

    def loss_fn(loss: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The last stage's output is already its micro-batch's loss (the trainer hands it the targets)."""
        return loss.sum() * model.pipeline_loss_scale

    model.pipeline = pp_lib.build_schedule(stages, pp.pp_schedule, Derived.of(cfg).micro_batches, loss_fn)
    return model


def _as_stage_output(head_loss):
    """A last stage's loss with one dimension: the schedule concatenates its micro-batches' outputs."""
    def stage_loss(hidden: torch.Tensor, head: nn.Linear, targets: torch.Tensor) -> torch.Tensor:
        return head_loss(hidden, head, targets).reshape(1)

    return stage_loss


def _tied_group(mesh: Meshes, dims: ParallelDims, pp) -> dist.ProcessGroup | None:
    """Process group joining the holders of stage 0 (embedding) and the last stage (head copy) for this rank's
    (dp, tp) coordinate, or None when one rank holds both."""
    from llmtrain.parallel import pipeline as pp_lib

    num_stages = dims.pp * pp.virtual_stages
    first = pp_lib.stage_owner(0, dims.pp, pp.virtual_stages, pp.pp_schedule)
    last = pp_lib.stage_owner(num_stages - 1, dims.pp, pp.virtual_stages, pp.pp_schedule)
    if first == last:
        return _SAME_RANK
    # Every rank creates every pair's group, in the same order (new_group's contract); each keeps its own.
    names = mesh.world.mesh_dim_names
    # Global ranks with the pp axis last: each row is one (dp, cp, tp) coordinate's pipeline.
    pipelines = mesh.world.mesh.movedim(names.index("pp"), -1).reshape(-1, dims.pp)
    mine = None
    for row in pipelines:
        pair = [int(row[first]), int(row[last])]
        group = dist.new_group(pair)
        if dist.get_rank() in pair:
            mine = group
    return mine


class _SameRank:
    """Marker: both tied copies live on this rank; sync_tied_weights adds them locally."""


_SAME_RANK = _SameRank()
