"""What a logged step reports: throughput over the steps since the last logged one, a metrics row (loss, lr,
grad norm, tokens/s, TFLOPS, MFU and its peak where the device's peak is known, memory, loss scale, the data
wait, for data=mix the tokens each source has given, for a MoE model the routing fields of train/moe_step.py) and
rank 0's console line. MFU is never over 100%: a step faster than the peak means the peak is wrong, which is said
once, and MFU is left out from then on. Reading the loss and grad norm waits for the device, so it happens on
logged steps only."""

from __future__ import annotations

import time
from typing import Callable

from llmtrain.rundir.mfu_field import PEAK_KEY
from llmtrain.train.metrics import MetricsWriter
from llmtrain.train.optim import lr_at


def moe_words(row: dict) -> str:
    """A MoE model's part of the console line: the load-balancing loss and the worst layer's expert load; under
    expert parallel also the worst layer's ep load and its busiest ep rank (the lowest of equals)."""
    if "aux_loss" not in row:
        return ""
    words = f" | aux_loss {row['aux_loss']:.4f} | expert_load {max(row['expert_load']):.2f}"
    if "ep_load" in row:
        loads = row["ep_load"]
        worst = max(range(len(loads)), key=loads.__getitem__)
        ranks = row["ep_tokens"][worst]
        words += f" | ep_load {loads[worst]:.2f} (rank {max(range(len(ranks)), key=ranks.__getitem__)} busiest)"
    return words


class StepLog:
    def __init__(self, train_cfg, metrics: MetricsWriter, log: Callable[..., None], tokens_per_step: int,
                 flops_per_token: float, peak_flops: float | None, world_size: int, scaler,
                 memory_gib: Callable[[], float], feed, stragglers=None, events=None,
                 peak_key: str = "hardware.peak_tflops"):
        self.t = train_cfg
        self.metrics = metrics
        self.log = log
        self.tokens_per_step = tokens_per_step
        self.flops_per_token = flops_per_token
        self.peak_flops = peak_flops  # None: no known peak, and no MFU
        self.peak_key = peak_key  # the key that gives the peak, named when a step outruns it
        self.world_size = world_size
        self.scaler = scaler
        self.memory_gib = memory_gib
        self.feed = feed  # a DataFeed: data_wait_ms and source_tokens
        self.stragglers = stragglers  # a StragglerWatch, or None when detection is off
        self.events = events  # GoodputEvents: the ledger's timeline
        self.window_start, self.window_tokens = time.perf_counter(), 0

    def due(self, step: int) -> bool:
        return step % self.t.log_interval == 0 or step == self.t.max_steps or step == 1

    def step_done(self, step: int, result, step_time: float, tokens_seen: int, elapsed_s: float,
                  samples_seen: int) -> None:
        self.window_tokens += self.tokens_per_step
        if not self.due(step):
            return
        now = time.perf_counter()
        tokens_per_s = self.window_tokens / max(now - self.window_start, 1e-9)
        self.window_start, self.window_tokens = now, 0
        row = {"step": step, "loss": float(result.loss), "lr": lr_at(step - 1, self.t),
               "grad_norm": float(result.grad_norm), "tokens_per_s": tokens_per_s, "step_time_s": step_time,
               "tokens": tokens_seen, "elapsed_s": elapsed_s, "mem_gib": self.memory_gib(),
               "data_wait_ms": self.feed.take_wait_ms()}
        source_tokens = self.feed.source_tokens(samples_seen)
        if source_tokens is not None:
            row["source_tokens"] = source_tokens
        # Model FLOPs (no recompute) per device per second, and that over the device's dense peak.
        row["tflops"] = self.flops_per_token * tokens_per_s / self.world_size / 1e12
        self._add_mfu(step, row)
        if self.scaler.enabled:
            row.update(loss_scale=self.scaler.scale, skipped_steps=self.scaler.skipped_steps)
        if result.moe:
            row.update(result.moe)
        named = self.stragglers.interval_done() if self.stragglers is not None else []
        if named:
            row["stragglers"] = named
        if self.events is not None:
            self.events.record("step", step)
        self.metrics.write(row)
        mfu = f" | MFU {row['mfu']:.1%}" if "mfu" in row else ""
        self.log(f"step {step:>6}/{self.t.max_steps} | loss {row['loss']:.4f} | lr {row['lr']:.2e} | "
                 f"grad_norm {row['grad_norm']:.3f}{moe_words(row)} | {tokens_per_s:,.0f} tok/s | "
                 f"{step_time * 1000:.0f} ms/step{mfu}", flush=True)

    def _add_mfu(self, step: int, row: dict) -> None:
        """MFU and the peak it is against, when the peak is known and this step did not outrun it."""
        if self.peak_flops is None:
            return
        mfu = row["tflops"] * 1e12 / self.peak_flops
        if mfu > 1:
            self.log(f"llmtrain: warning: step {step} ran {row['tflops']:.3g} TFLOPS per device, above the peak of "
                     f"{self.peak_flops / 1e12:.3g} TFLOPS ({self.peak_key}): that peak is wrong; MFU is not shown "
                     "for the rest of this run", flush=True)
            self.peak_flops = None
            return
        row["mfu"], row[PEAK_KEY] = mfu, self.peak_flops / 1e12

    def eval_done(self, step: int, result) -> None:
        """`result`: an EvalResult (val_loss, and per-source losses for data=mix)."""
        row = {"step": step, "val_loss": result.val_loss}
        per_source = ""
        if result.source_val_loss is not None:
            row["source_val_loss"] = result.source_val_loss
            per_source = " | " + " ".join(f"{name} {loss:.4f}" for name, loss in result.source_val_loss.items())
        self.metrics.write(row)
        self.log(f"step {step:>6}/{self.t.max_steps} | val_loss {result.val_loss:.4f}{per_source}", flush=True)
