"""What the training loop reads: this rank's batches (one dataset through SampleStream, or a data=mix mixture),
copied to the device, with the time that takes (data_wait_ms) and, for a mixture, what each source has given."""

from __future__ import annotations

import json
import time

import torch

from llmtrain.data import SampleStream, batch_indices, build_dataset
from llmtrain.train.fault_injection import BLOCK_DATA, hang_here


class DataFeed:
    def __init__(self, cfg, device: torch.device, dp_rank: int, dp_size: int,
                 positions: torch.Tensor | None = None):
        """`positions`: under context parallel, the sequence positions of this rank's share of each sample."""
        self.t = cfg.train
        self.positions = positions
        self.seq_len = int(cfg.model.seq_len)
        self.device = device
        self.dp_rank, self.dp_size = dp_rank, dp_size
        self.stream: SampleStream | None = None
        self.mixture = None
        if cfg.data.name == "mix":
            from llmtrain.data.mixture_data import MixtureData

            self.mixture = MixtureData(cfg.data, cfg.model, cfg.train.seed)
        else:
            self.stream = SampleStream(build_dataset(cfg.data, cfg.model, cfg.train.seed), cfg.train.seed)
        self._wait_s, self._steps = 0.0, 0
        self.hang_at: set[tuple[str, int]] = set()  # injected hangs (fault_injection.py), set by the trainer

    def _indices(self, step: int, micro_step: int, sample_offset: int | None) -> list[int]:
        t = self.t
        return batch_indices(step, micro_step, self.dp_rank, self.dp_size, t.micro_batch_size,
                             t.global_batch_size, sample_offset)

    def train_batch(self, step: int, micro_step: int, samples_seen: int) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's micro-batch of the step that starts at global sample `samples_seen`, on the device."""
        start = time.perf_counter()
        if micro_step == 0 and (BLOCK_DATA, step + 1) in self.hang_at:
            hang_here()
        if self.mixture is not None:
            x, y = self.mixture.train_batch(self._indices(step, micro_step, samples_seen))
        else:
            t = self.t
            x, y = self.stream.batch("train", step, micro_step, self.dp_rank, self.dp_size, t.micro_batch_size,
                                     t.global_batch_size, sample_offset=samples_seen)
        batch = self._to_device(x, y)
        self._wait_s += time.perf_counter() - start
        return batch

    def val_batch(self, batch: int, micro_step: int, source: str | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
        """Eval batch `batch` of the val split (of one mixture source), the same samples in any layout."""
        if self.mixture is not None:
            x, y = self.mixture.val_batch(source, self._indices(batch, micro_step, None))
        else:
            t = self.t
            x, y = self.stream.batch("val", batch, micro_step, self.dp_rank, self.dp_size, t.micro_batch_size,
                                     t.global_batch_size)
        return self._to_device(x, y)

    def _to_device(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.positions is not None:
            x, y = x[:, self.positions], y[:, self.positions]
        if self.device.type == "cuda":
            # A copy from pageable memory waits for the GPU; from pinned memory it queues behind the running step.
            x, y = x.pin_memory(), y.pin_memory()
        return x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)

    # ---- per-step accounting ---------------------------------------------------------------------------------
    def step_done(self, step: int, samples_before: int, samples_after: int) -> list[str]:
        """Count the step for data_wait_ms; the console lines of source epochs that began during it."""
        self._steps += 1
        if self.mixture is None:
            return []
        before = self.mixture.schedule.consumed(samples_before)
        after = self.mixture.schedule.consumed(samples_after)
        return [f"llmtrain: source {name} starts epoch {epoch} at step {step}"
                for name, epoch in self.mixture.epochs_started(before, after)]

    def take_wait_ms(self) -> float:
        """Mean time per step spent fetching this rank's batches and copying them, since the last call."""
        mean = 1000 * self._wait_s / max(1, self._steps)
        self._wait_s, self._steps = 0.0, 0
        return mean

    def source_tokens(self, samples_seen: int) -> dict[str, int] | None:
        """Tokens each source has given over the whole run (None unless data=mix)."""
        if self.mixture is None:
            return None
        return {name: count * self.seq_len for name, count in self.mixture.schedule.consumed(samples_seen).items()}

    # ---- checkpoint --------------------------------------------------------------------------------------------
    def state(self, samples_seen: int) -> dict | None:
        """The mixture's history and per-source samples consumed (None unless data=mix)."""
        if self.mixture is None:
            return None
        return {"segments": self.mixture.schedule.to_json(),
                "source_samples": self.mixture.schedule.consumed(samples_seen)}

    def state_text(self, samples_seen: int) -> str | None:
        state = self.state(samples_seen)
        return None if state is None else json.dumps(state)

    def load_state_text(self, text: str, samples_seen: int) -> bool:
        """Restore the mixture history; whether this run's weights started a new segment."""
        return self.mixture.resume(json.loads(text)["segments"], samples_seen)
