"""The global sample stream: which samples each (step, micro_step, dp_rank) trains on.

Global step `s` consumes global sample indices [s*G, (s+1)*G), G = global batch size. Micro-step
m of dp rank r (of dp_size, micro batch mb) takes `s*G + m*mb*dp_size + r*mb + j`, j in [0, mb).
The union over (m, r) is exactly the step's G indices, so the samples a step sees do not depend
on the DP layout, and a checkpoint resumes exactly under another dp_size/accumulation split.

A global index maps to a train window through a per-epoch permutation (epoch = idx // N,
window = randperm(N, seed, epoch)[idx % N]): every window once per epoch, in an order that is a
pure function of the seed. Val indices take val windows in order (modulo their count).

Use `SampleStream(dataset, seed).batch(...)`, or `get_batch(dataset, ..., seed)`, which keeps
one SampleStream per dataset so the permutation is not recomputed each call.
"""

from __future__ import annotations

import weakref

import torch

from .datasets import TokenDataset
from .seeding import stable_seed


def batch_indices(
    step: int, micro_step: int, dp_rank: int, dp_size: int, micro_batch_size: int, global_batch_size: int,
    sample_offset: int | None = None,
) -> list[int]:
    """Global sample indices for one micro-batch of one dp rank (see the module docstring).

    `sample_offset` (default step * global_batch_size) is where the step starts in the global stream: a run
    resumed with another global batch size continues from the samples it had consumed."""
    per_micro_step = micro_batch_size * dp_size
    if micro_batch_size < 1 or dp_size < 1 or global_batch_size < 1:
        raise ValueError(
            f"batch sizes must be positive: micro_batch_size={micro_batch_size}, dp_size={dp_size}, "
            f"global_batch_size={global_batch_size}"
        )
    if global_batch_size % per_micro_step:
        raise ValueError(
            f"global_batch_size {global_batch_size} is not a multiple of micro_batch_size*dp_size = {per_micro_step}"
        )
    accum = global_batch_size // per_micro_step
    if not 0 <= micro_step < accum:
        raise ValueError(f"micro_step {micro_step} out of range [0, {accum})")
    if not 0 <= dp_rank < dp_size:
        raise ValueError(f"dp_rank {dp_rank} out of range [0, {dp_size})")
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    base = step * global_batch_size if sample_offset is None else sample_offset
    start = base + micro_step * per_micro_step + dp_rank * micro_batch_size
    return list(range(start, start + micro_batch_size))


class SampleStream:
    """Maps global sample indices to windows of `dataset`; caches the current epoch's permutation."""

    def __init__(self, dataset: TokenDataset, seed: int):
        self.dataset = dataset
        self.seed = int(seed)
        self._epoch: int | None = None
        self._permutation: torch.Tensor | None = None

    def window(self, split: str, index: int) -> int:
        """The window (sample index within `split`) that global index `index` reads."""
        n = self.dataset.num_samples(split)
        if split == "val" or not self.dataset.shuffle_train:
            return index % n
        epoch, position = divmod(index, n)
        return int(self._epoch_permutation(epoch, n)[position])

    def batch(
        self,
        split: str,
        step: int,
        micro_step: int,
        dp_rank: int,
        dp_size: int,
        micro_batch_size: int,
        global_batch_size: int,
        sample_offset: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets), LongTensors of shape (micro_batch_size, seq_len). For "val", step is the eval batch number."""
        indices = batch_indices(step, micro_step, dp_rank, dp_size, micro_batch_size, global_batch_size,
                                sample_offset)
        rows = torch.stack([self.dataset.sample(split, self.window(split, i)) for i in indices])
        return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()

    def _epoch_permutation(self, epoch: int, n: int) -> torch.Tensor:
        # Only one epoch is kept: memory stays at one permutation however long the run.
        if self._epoch != epoch or self._permutation is None or len(self._permutation) != n:
            generator = torch.Generator().manual_seed(stable_seed("train-order", self.seed, epoch))
            permutation = torch.randperm(n, generator=generator)
            # int32 halves the cache for the usual case (fewer than 2**31 windows).
            self._permutation = permutation.to(torch.int32) if n < 2**31 else permutation
            self._epoch = epoch
        return self._permutation


# One stream per live dataset, so get_batch reuses the cached permutation across calls.
_streams: "weakref.WeakKeyDictionary[TokenDataset, SampleStream]" = weakref.WeakKeyDictionary()


def get_batch(
    dataset: TokenDataset,
    split: str,
    step: int,
    micro_step: int,
    dp_rank: int,
    dp_size: int,
    micro_batch_size: int,
    global_batch_size: int,
    seed: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets) of shape (micro_batch_size, seq_len) for this rank's micro-batch."""
    stream = _streams.get(dataset)
    if stream is None or stream.seed != int(seed):
        stream = _streams[dataset] = SampleStream(dataset, seed)
    return stream.batch(split, step, micro_step, dp_rank, dp_size, micro_batch_size, global_batch_size)
