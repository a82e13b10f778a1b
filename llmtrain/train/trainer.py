"""The training loop of one worker: data, forward/backward (plain or pipelined), global clipping, AdamW, eval, metrics."""

from __future__ import annotations

import contextlib
import functools
import os
import time
from dataclasses import dataclass

import psutil
import torch
import torch.distributed as dist
from omegaconf import DictConfig
from torch.distributed.tensor import DTensor

from llmtrain.config.batch import batch_words
from llmtrain.config.derived import Derived, torch_dtype
from llmtrain.hardware.fp8_device import check_fp8_node
from llmtrain.checkpoint.manager import CheckpointManager
from llmtrain.checkpoint.resume import Resolution, resolve_in_worker
from llmtrain.checkpoint.training_state import TrainingState
from llmtrain.checkpoint.pretrained import configured_pretrained
from llmtrain.parallel.build import ParallelModel, build_parallel_model
from llmtrain.parallel.grad_norm import clip_grad_norm_
from llmtrain.parallel.layout import ParallelDims
from llmtrain.parallel.context_parallel import mesh_positions
from llmtrain.parallel.mesh import build_mesh
from llmtrain.train.attention import attention_context
from llmtrain.train.bad_streak import BadStreak, last_good_state
from llmtrain.train.loss_scale import DynamicLossScaler
from llmtrain.train.data_feed import DataFeed
from llmtrain.train.evaluation import EvalResult, evaluate
from llmtrain.train.memory import PeakMemory, SavedActivations, local_state_bytes
from llmtrain.train.mfu import model_flops
from llmtrain.train.collective_trace import TRACE
from llmtrain.train.fault_injection import (SKIP_COLLECTIVE, SLEEP_IN_STEP, compute_slowdown, exit_fault,
                                            gradient_fault, hang_here, injected_hangs)
from llmtrain.train.goodput_events import GoodputEvents
from llmtrain.train.metrics import MetricsWriter
from llmtrain.train.moe_step import MoEStep
from llmtrain.train.nonfinite import nonfinite_flag, report_nonfinite
from llmtrain.train.preemption import Preempted, PreemptionFlag
from llmtrain.train.progress_beat import ProgressBeat
from llmtrain.train.rollback import SpikeGuard
from llmtrain.train.run_end import last_step, nothing_to_do
from llmtrain.train.save_schedule import SaveSchedule
from llmtrain.train.spike_rule import Spike
from llmtrain.train.step_log import StepLog
from llmtrain.train.step_profiler import StepProfiler
from llmtrain.train.straggler_watch import watch_stragglers
from llmtrain.train.trackers.fanout import open_trackers
from llmtrain.train.optim import build_optimizer, lr_at, resolve_fused, set_lr
from llmtrain.rundir.paths import RunPaths


def plain(t: torch.Tensor) -> torch.Tensor:
    """A loss computed under loss_parallel is a replicated DTensor; logging wants a plain tensor."""
    return t.full_tensor() if isinstance(t, DTensor) else t


@dataclass
class StepResult:
    # Tensors on the device, read (a host sync) only when a step is logged.
    loss: torch.Tensor | float
    grad_norm: torch.Tensor | float
    skipped: bool
    moe: dict | None = None  # a MoE model's fields of a logged step's metrics row
    spike: Spike | None = None  # train.spike's verdict (only with train.spike.sigma set)


class Trainer:
    def __init__(self, cfg: DictConfig, run_dir: str, device: torch.device, launched: Resolution | None = None,
                 batch_origin: str | None = None):
        """`launched`: what the launcher resolved checkpoint.resume to (job.json), for the first start;
        `batch_origin`: where train.global_batch_size came from (config/batch.py's ORIGIN_WORDS; job.json too)."""
        self.cfg = cfg
        self.batch_origin = batch_origin
        self.run_dir = run_dir
        self.device = device
        self.rank = dist.get_rank()
        # First, before anything is built: a compute dtype this GPU lacks is a one-line ConfigError; a CPU or an
        # unknown GPU without a given peak only loses MFU (rank 0 says so once).
        check_fp8_node(cfg, device.type)  # precision=fp8 with hardware=auto: known only now, on this node
        self.flops_per_token, self.peak_flops = model_flops(cfg, device.type, print if self.rank == 0 else None)
        self.peak_memory = PeakMemory(device, cfg.profile.memory)
        self.dims = ParallelDims.from_config(cfg)
        self.mesh = build_mesh(self.dims, device.type)
        self.dp_group = self.mesh.dp.get_group()
        self.batch_group = self.mesh.batch.get_group()  # dp x cp: the ranks holding different tokens
        self.dp_rank = self.mesh.dp.get_local_rank()
        self.pp_group = self.mesh.pp.get_group()
        for name in ("dp_replicate", "dp_shard", "pp", "tp", "dp"):  # "dp" last: it may be one of the others
            TRACE.name_group(self.mesh.world[name].get_group() if name != "dp" else self.dp_group, name)
        self.compute_dtype = torch_dtype(cfg.precision.compute_dtype)

        self.model: ParallelModel = build_parallel_model(cfg, self.dims, self.mesh, device,
                                                           configured_pretrained(cfg.model))
        self.params = self.model.parameters()
        self.moe = MoEStep.build(cfg, self.model.parts, self.mesh, self.dims, device)
        self.fused = resolve_fused(cfg.optim.fused, device.type)
        self.optimizer = build_optimizer(self.model.parts, cfg.train, self.fused)
        p = cfg.precision
        self.scaler = DynamicLossScaler(p.init_scale, p.growth_factor, p.backoff_factor, p.growth_interval,
                                        enabled=p.name == "fp16")
        self.feed = DataFeed(cfg, device, self.dp_rank, self.dims.dp, mesh_positions(self.mesh.cp, cfg.model.seq_len))
        self.accum = Derived.of(cfg).micro_batches
        self.profiler = StepProfiler(cfg.profile.steps, RunPaths(run_dir).profile, self.rank, device)
        # Step, data position, loss scaler, mixture history, training time: what a checkpoint restores.
        self.state = TrainingState(self.scaler, self.feed)
        self.bad_steps = 0
        self.bad_since: int | None = None  # first step of the open streak of non-finite (skipped) steps
        self.state_bytes: dict[str, int] = {}
        self.saved_activations = SavedActivations(self.model.parameters())
        is_logger = self.rank == 0
        self.log = print if is_logger else (lambda *a, **k: None)
        self.preempt = PreemptionFlag()
        self.save_schedule = SaveSchedule(cfg.checkpoint, self.rank)
        self.fault, self.exit_fault = gradient_fault(self.rank), exit_fault(self.rank)
        self.hangs = self.feed.hang_at = injected_hangs(self.rank)
        self.slowdown = compute_slowdown(self.rank)
        self.beat = ProgressBeat(run_dir, self.rank)
        self.compute, self.stragglers = watch_stragglers(cfg.launch, device, self.log, run_dir, is_logger)
        self.events = GoodputEvents(run_dir, enabled=is_logger)
        self.ckpt = CheckpointManager(cfg, run_dir, self.log, self.model, self.optimizer, self.state)
        self.spikes = SpikeGuard(cfg, run_dir, self.ckpt, self.state, self.log, self.rank, self.beat.phase)
        self.resume(launched)
        # Rows past the resumed step came from an attempt that did not reach a checkpoint: they are replaced.
        self.metrics = MetricsWriter(RunPaths(run_dir).metrics if is_logger else None, keep_until_step=self.step,
                                     tensorboard_dir=RunPaths(run_dir).tensorboard
                                     if is_logger and cfg.logging.tensorboard else None,
                                     trackers=open_trackers(cfg, run_dir, resumed=self.step > 0)
                                     if is_logger else None)

    @property
    def step(self) -> int:
        """Optimizer steps taken: the TrainingState's, which only it and a checkpoint load change."""
        return self.state.step

    def resume(self, launched: Resolution | None) -> None:
        restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
        requeued = int(os.environ.get("SLURM_RESTART_COUNT", "0"))
        resolution = resolve_in_worker(self.run_dir, self.cfg.checkpoint.resume, launched, restart, requeued)
        if launched is None and not (restart or requeued):  # no launcher said which checkpoint and why
            self.log(resolution.line(), flush=True)
        if restart or requeued:  # otherwise the launcher has said which checkpoint it resumes and which it ignores
            for info in resolution.ignored:
                self.log(f"llmtrain: ignoring incomplete checkpoint {info.path} (its save did not finish)",
                         flush=True)
        prefix = f"restart {restart} of {self.cfg.launch.max_restarts}: " if restart else \
            (f"requeued job (restart {requeued}): " if requeued else "")
        if resolution.checkpoint is not None:
            self.ckpt.load(resolution.checkpoint, prefix)
            self.spikes.resumed()  # past the samples of the run's rollbacks
        elif restart:
            self.log(f"llmtrain: {prefix}no complete checkpoint yet; starting again from step 0", flush=True)

    # ---- one optimizer step ------------------------------------------------------------------------------------
    def autocast(self):
        if self.compute_dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.compute_dtype)

    def model_loss(self, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The mean fp32 cross entropy of one micro-batch, computed by the model's head_loss (train.loss)."""
        with self.autocast():
            return model(x, targets=y)

    plain = staticmethod(plain)

    def loss_factor(self) -> float:
        """What the LM loss is multiplied by before backward: the loss scale, over the micro-batches unless the
        pipeline schedule divides the gradients by them itself."""
        scale = self.scaler.scale if self.scaler.enabled else 1.0
        return scale if self.model.pipeline is not None else scale / self.accum

    def forward_backward(self) -> torch.Tensor:
        """Run all micro-batches of this step on this dp rank; return the mean loss (valid on last pp stage)."""
        if self.model.pipeline is not None:
            return self._pipeline_forward_backward()
        total = torch.zeros((), device=self.device)
        model = self.model.parts[0]
        for m in range(self.accum):
            x, y = self.feed.train_batch(self.step, m, self.state.samples_seen)
            # Reduce gradients across dp only after the last micro-batch.
            self.model.set_gradient_sync(m == self.accum - 1)
            measure = self.step == 0 and m == 0  # activation bytes of one micro-batch, for `plan`'s checks
            with self.model.loss_context(), (self.saved_activations if measure else contextlib.nullcontext()):
                loss = self.model_loss(model, x, y)
                self.scaler.scale_loss(loss / self.accum).backward()
            total += plain(loss.detach())
        return total / self.accum

    def _pipeline_forward_backward(self) -> torch.Tensor:
        batches = [self.feed.train_batch(self.step, m, self.state.samples_seen) for m in range(self.accum)]
        return self.run_pipeline(batches, train=True)

    def run_pipeline(self, batches: list[tuple[torch.Tensor, torch.Tensor]], train: bool) -> torch.Tensor:
        """All micro-batches through the pipeline schedule (step = forward + backward, eval = forward only);
        the mean loss on the last stage, zero elsewhere."""
        x = torch.cat([b[0] for b in batches])
        y = torch.cat([b[1] for b in batches])
        losses: list[torch.Tensor] = []
        scale = self.scaler.scale if (train and self.scaler.enabled) else 1.0
        self.model.pipeline_loss_scale = scale
        from llmtrain.parallel.pipeline import evaluate_schedule  # imported with a pipeline only

        run = self.model.pipeline.step if train else functools.partial(evaluate_schedule, self.model.pipeline)
        with self.model.loss_context(), self.autocast():
            # `targets` reaches every stage's forward; the last stage's returns its micro-batch's loss.
            if self.model.has_first_stage:
                run(x, target=y, losses=losses, targets=y)
            else:
                run(target=y, losses=losses, targets=y)
        if self.model.has_last_stage:
            return torch.stack([plain(loss.detach()).float() for loss in losses]).mean() / scale
        return torch.zeros((), device=self.device)

    def train_step(self) -> StepResult:
        for part in self.model.parts:
            if not part.training:  # only after an eval: train() walks every submodule (~0.2 ms a step on CPU)
                part.train()
        if self.exit_fault is not None:
            self.exit_fault(self.step + 1)
        if self.moe is not None:
            self.moe.start(self.loss_factor())
        self.compute.start()
        with attention_context(self.cfg.train.attention):
            local_loss = self.forward_backward()
        compute_s = self.compute.stop()
        if self.fault is not None:
            self.fault(self.step + 1, self.params)
        local_loss = self.spikes.inject(local_loss, self.params)
        if (SLEEP_IN_STEP, self.step + 1) in self.hangs:
            hang_here()
        self.model.finish_gradients()
        overflow_here = self.scaler.unscale_and_check(self.params, self.device)
        grad_norm = clip_grad_norm_(self.params, self.cfg.train.grad_clip, self.pp_group,
                                    norm_params=self.model.norm_parameters())
        # One MAX all-reduce makes every rank take the same decision, even when only one rank saw inf/NaN (a
        # replicated gradient's norm is computed locally, so ranks could otherwise disagree and deadlock). The
        # flags stay on the device: reading them is the step's one wait for the GPU.
        flags = torch.zeros(2, device=grad_norm.device)
        flags[0] = float(overflow_here)
        flags[1] = (~torch.isfinite(grad_norm)).float()
        # One rank has nobody to agree with: no all-reduce (a gloo round trip through its worker thread).
        if dist.get_world_size() > 1 and (SKIP_COLLECTIVE, self.step + 1) not in self.hangs:
            dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        overflow_seen, nonfinite_seen = flags.tolist()
        overflow, bad = overflow_seen > 0, max(overflow_seen, nonfinite_seen) > 0
        if bad:
            report_nonfinite(self.params, self.rank, self.step + 1, overflow, self.scaler, self.log)
        loss = self.global_mean_loss(local_loss)  # every rank's, before the update: the spike rule reads it
        spike = self.spikes.judge(self.step + 1, loss, grad_norm, bad)
        if not bad and self.spikes.applies(spike):
            set_lr(self.optimizer, lr_at(self.step, self.cfg.train))
            self.ckpt.wait_for_staging()
            self.compute.start()
            self.optimizer.step()
            compute_s += self.compute.stop()
            self.model.after_optimizer_step()
        if self.slowdown is not None:  # inside a compute region, as a slower rank's own work would be
            self.compute.start()
            self.slowdown(self.step + 1, compute_s)
            self.compute.stop()
        if self.step == 0:
            self.state_bytes = local_state_bytes(self.model, self.optimizer)
            self.state_bytes["activations"] = self.saved_activations.total
        self.scaler.update(overflow)
        # Gradients are freed (torch's default set_to_none=True); apex's FusedAdam.zero_grad takes no argument.
        self.optimizer.zero_grad()
        return StepResult(loss=loss, grad_norm=grad_norm, skipped=bad, spike=spike)

    def global_mean_loss(self, local_loss: torch.Tensor) -> torch.Tensor:
        """Loss averaged over dp x cp (equal shares of tokens); under pp only the last stage has it, so sum over the pp group first."""
        loss = local_loss.detach().float().clone()
        if self.dims.pp > 1:
            dist.all_reduce(loss, group=self.pp_group)
        if self.dims.dp * self.dims.cp > 1:
            dist.all_reduce(loss, op=dist.ReduceOp.AVG, group=self.batch_group)
        return loss

    def evaluate(self) -> EvalResult:
        with attention_context(self.cfg.train.attention):
            return evaluate(self)

    # ---- the loop ------------------------------------------------------------------------------------------------
    def memory_gib(self) -> float:
        if self.device.type == "cuda":
            return torch.cuda.max_memory_allocated(self.device) / 2**30
        return psutil.Process().memory_info().rss / 2**30

    def train(self) -> None:
        try:
            self._train()
        except BaseException:
            # The trackers' runs end as failed (a preempted launch has closed them as preempted already).
            self.metrics.close(status="failed")
            raise

    def _train(self) -> None:
        t, state = self.cfg.train, self.state
        self._describe()
        last = last_step(t)
        first_step = self.step
        self.state.restart_clock()
        self.save_schedule.restart_clock()
        done = nothing_to_do(first_step, t)
        if done:  # the launcher says so before starting workers; a restart or requeue may still get here
            self.log(done, flush=True)
            self._close()
            return
        step_log = StepLog(t, self.metrics, self.log, Derived.of(self.cfg).tokens_per_step, self.flops_per_token,
                           self.peak_flops, dist.get_world_size(), self.scaler, self.memory_gib, self.feed,
                           self.stragglers, self.events, f"hardware.peak_tflops.{self.cfg.precision.compute_dtype}")
        self.events.record("train", self.step)
        while self.step < last:
            result, step_time = self._timed_step(first_step)
            if result.spike is not None and self.spikes.act(result.spike, self.metrics):
                self.bad_steps, self.bad_since = 0, None
                continue  # rolled back: the checkpoint's state, the stream past the skipped samples
            state.advance(t.global_batch_size, step_log.tokens_per_step)
            if self.moe is not None:  # the router bias balancing, and a logged step's expert statistics
                result.moe = self.moe.finish(step_log.due(state.step), result.skipped)
            self.beat.step_done(state.step, step_time)
            for line in self.feed.step_done(state.step, state.samples_seen - t.global_batch_size, state.samples_seen):
                self.log(line, flush=True)
            try:
                self._check_bad_step(result)
            except BadStreak as streak:
                self.spikes.streak(streak, self.bad_since, self.metrics)  # raised again unless policy rollback
                self.bad_steps, self.bad_since = 0, None
                continue
            step_log.step_done(state.step, result, step_time, state.tokens_seen, state.elapsed_s(), state.samples_seen)
            if t.eval_interval and t.eval_steps and (self.step % t.eval_interval == 0 or self.step == t.max_steps):
                with self.beat.phase("eval"):
                    step_log.eval_done(self.step, self.evaluate())
            self.ckpt.poll()
            preempted, save_by_time = self.preempt.agreed(self.save_schedule.time_vote())
            self._stop_if_preempted(preempted)
            if self.save_schedule.due(self.step, last, save_by_time):
                with self.beat.phase("checkpoint"):
                    self.save_checkpoint(asynchronous=self.cfg.checkpoint.async_save)
        if self.cfg.checkpoint.at_end or self.step < t.max_steps:
            with self.beat.phase("checkpoint"):
                self.save_checkpoint(asynchronous=False)
        self.ckpt.finish()
        self.events.record("end", self.step)
        self._close()
        this_launch = time.perf_counter() - state.segment_start
        resumed = f" ({self.step - first_step} since resuming at step {first_step}, in {this_launch:.1f} s)" \
            if first_step else ""
        ended = "done" if self.step >= t.max_steps else \
            f"stopped at step {self.step} of {t.max_steps} (train.stop_at_step)"
        per_source = self.feed.source_tokens(state.samples_seen)
        sources = " (" + ", ".join(f"{name} {n:,}" for name, n in per_source.items()) + ")" if per_source else ""
        self.log(f"llmtrain: {ended}, {state.step} steps, {state.tokens_seen:,} tokens{sources} in "
                 f"{state.elapsed_s():.1f} s{resumed}", flush=True)

    def _describe(self) -> None:
        t, m = self.cfg.train, self.cfg.model
        fused = self.cfg.optim.fused
        kernel = f"optim.fused={fused}" + (f" -> {self.fused} on {self.device.type}" if fused != self.fused else "")
        self.log(f"llmtrain: {self.model.describe()}; layout {self.dims.degrees} "
                 f"zero={self.dims.zero}; {kernel}; {t.max_steps} steps of {t.global_batch_size} x "
                 f"{m.seq_len} tokens ({batch_words(self.batch_origin, t.global_batch_size)}{self.accum} "
                 f"micro-batches of {t.micro_batch_size} per dp rank)", flush=True)
        if self.model.float8 is not None:
            self.log(f"llmtrain: {self.model.float8.describe(self.cfg.train.compile)}", flush=True)
        if self.model.init_from_note and self.step == 0:  # a resumed run continues from its checkpoint instead
            self.log(f"llmtrain: {self.model.init_from_note}", flush=True)
        padded = Derived.of(self.cfg).padded_vocab
        if padded != m.vocab_size:
            self.log(f"llmtrain: vocabulary padded {m.vocab_size} -> {padded} rows "
                     f"(model.vocab_pad_multiple={m.vocab_pad_multiple})", flush=True)

    def _timed_step(self, first_step: int) -> tuple[StepResult, float]:
        """One optimizer step under the profilers; its result and wall time."""
        start = time.perf_counter()
        self.profiler.before_step(self.step + 1)
        self.peak_memory.before_step(self.step + 1 - first_step)
        result = self.train_step()
        peak = self.peak_memory.after_step(self.step + 1 - first_step)
        self.profiler.after_step(self.step + 1)
        if peak is not None:
            self.state_bytes["peak"] = peak
            self.log(f"llmtrain: peak tensor memory over the first {self.peak_memory.steps} steps: "
                     f"{peak / 2**20:.1f} MiB on rank 0", flush=True)
        return result, time.perf_counter() - start

    def _stop_if_preempted(self, preempted: bool) -> None:
        if preempted:
            self.log(f"llmtrain: preemption signal received at step {self.step}", flush=True)
            saved = self.save_checkpoint(asynchronous=False)
            self.ckpt.finish()  # a fast tier's copy goes up to the store within the grace period
            self.metrics.close(status="preempted")
            raise Preempted(self.step, saved)

    def _close(self) -> None:
        self.peak_memory.close()
        self.metrics.close()

    def _check_bad_step(self, result: StepResult) -> None:
        # fp16 overflows are the loss scaler's normal work (weights and moments untouched): not a bad streak.
        if not result.skipped or self.scaler.enabled:
            if not result.skipped:
                self.bad_steps, self.bad_since = 0, None
            return
        self.bad_steps += 1
        self.bad_since = self.bad_since or self.step
        if self.bad_steps >= self.cfg.train.max_bad_steps:
            raise BadStreak(f"{self.bad_steps} consecutive non-finite steps (train.max_bad_steps="
                            f"{self.cfg.train.max_bad_steps}); stopping at step {self.step} without saving; "
                            f"{last_good_state(self.ckpt.last_good, self.bad_since)}")

    def save_checkpoint(self, asynchronous: bool) -> bool:
        """Save unless the state may be poisoned: never after a non-finite step (the streak may not be over),
        never with non-finite parameters. Every rank takes the same decision. Returns whether it saved."""
        why, landed = self._unsafe_to_save(), False
        if why:
            good = self.ckpt.last_good
            where = f"the last good checkpoint is {good[0]}" if good else "this run has no earlier checkpoint"
            self.log(f"llmtrain: step {self.step}: not saving a checkpoint: {why} ({where})", flush=True)
        else:
            started = time.perf_counter()
            landed = self.ckpt.save(asynchronous=asynchronous)
            self.events.record("save", self.step, blocked_s=time.perf_counter() - started)
        self.save_schedule.restart_clock()  # the next interval counts training time, not this save's
        return landed

    def _unsafe_to_save(self) -> str | None:
        if self.bad_since is not None:  # the same on every rank: decided by the all-reduced flags
            return (f"steps {self.bad_since}-{self.step} were non-finite" if self.bad_since < self.step
                    else f"step {self.step} was non-finite")
        if not self._params_finite():
            return "the model parameters hold inf/NaN"
        return None

    @torch.no_grad()
    def _params_finite(self) -> bool:
        """One MAX all-reduce of a local flag: each rank only sees its own shards."""
        bad = nonfinite_flag([p.to_local() if isinstance(p, DTensor) else p for p in self.params])
        dist.all_reduce(bad, op=dist.ReduceOp.MAX)
        return not bad.item()
