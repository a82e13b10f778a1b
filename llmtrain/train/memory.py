"""Measured memory of one rank: the bytes autograd saves for backward, and the peak of live tensor bytes.

The peak is what `llmtrain plan` predicts, so the planner can be checked against it. On CUDA it is the caching
allocator's max_memory_allocated. On CPU no allocator keeps a peak, so with `profile.memory=true` the trainer
records the CPU allocator's events through torch.profiler (profile_memory) from before the model is built to the
end of the measured steps, and the peak is the highest running total of bytes allocated and not yet freed.
"""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

WINDOW_EVENT = "llmtrain.memory.window"


class SavedActivations:
    """Context manager: bytes of the distinct storages autograd saves for backward, parameters excluded."""

    def __init__(self, params):
        self.param_ptrs = {ptr for p in params for ptr, _ in _storages(p)}
        self.storages: dict[int, int] = {}
        self._hooks = None

    def _pack(self, t: torch.Tensor):
        for ptr, nbytes in _storages(t):
            if ptr not in self.param_ptrs:
                self.storages[ptr] = nbytes
        return t

    @property
    def total(self) -> int:
        return sum(self.storages.values())

    def __enter__(self):
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self._hooks.__exit__(*exc)


def _storages(t: torch.Tensor) -> list[tuple[int, int]]:
    """(data pointer, bytes) of the storages holding `t`: a DTensor's local shard, a wrapper subclass's inner
    tensors (torchao's float8 tensors: their float8 data and scale), else its own."""
    if isinstance(t, DTensor):
        t = t.to_local()
    if is_traceable_wrapper_subclass(t):
        names, _ = t.__tensor_flatten__()
        return [s for name in names for s in _storages(getattr(t, name))]
    try:
        storage = t.untyped_storage()
        return [(storage.data_ptr(), storage.nbytes())]
    except (RuntimeError, NotImplementedError):
        return []


class PeakMemory:
    """Peak live tensor bytes of this rank over training steps 1..steps (None until measured, or when off)."""

    def __init__(self, device: torch.device, enabled: bool, steps: int = 2):
        self.device = device
        self.steps = steps
        self.peak_bytes: int | None = None
        self._prof = None
        self._window = None
        if device.type == "cpu" and enabled:
            from torch.profiler import ProfilerActivity, profile

            # Started before the model exists: every tensor of the run is allocated while it records.
            self._prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
            self._prof.__enter__()

    def before_step(self, step: int) -> None:
        if step != 1:
            return
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        elif self._prof is not None:
            self._window = torch.profiler.record_function(WINDOW_EVENT)
            self._window.__enter__()

    def after_step(self, step: int) -> int | None:
        """The peak, returned once: after the last measured step (None at every other step or when off)."""
        if step != self.steps:
            return None
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak_bytes = torch.cuda.max_memory_allocated(self.device)
        elif self._prof is not None:
            self._window.__exit__(None, None, None)
            self._prof.__exit__(None, None, None)
            self.peak_bytes = cpu_peak(self._prof.profiler.kineto_results)
            self._prof = None
        return self.peak_bytes

    def close(self) -> None:
        """Stop recording if training ended before the measured steps did."""
        if self._prof is not None:
            if self._window is not None:
                self._window.__exit__(None, None, None)
            self._prof.__exit__(None, None, None)
            self._prof = None


def cpu_peak(result) -> int | None:
    """The highest total of live CPU allocation bytes inside the window event.

    The profiler records allocator events only on the threads it profiles, so a tensor whose last reference dies
    on another thread (a collective's worker thread) is freed without an event. The allocator hands such an
    address out again later: a new allocation at an address still held counts as that block's free.
    """
    from torch._C._profiler import _EventType

    events, stack = [], list(result.experimental_event_tree())
    while stack:
        e = stack.pop()
        events.append(e)
        stack.extend(e.children)
    window = next((e for e in events if e.name == WINDOW_EVENT), None)
    if window is None:
        return None
    start, end = window.start_time_ns, window.end_time_ns
    allocations = sorted((e.start_time_ns, e.extra_fields.ptr, e.extra_fields.alloc_size) for e in events
                         if e.tag == _EventType.Allocation and e.extra_fields.device.type == "cpu")
    live: dict[int, int] = {}
    total, peak = 0, 0
    for t, ptr, size in allocations:
        if size > 0:
            total += size - live.get(ptr, 0)
            live[ptr] = size
        else:
            total -= live.pop(ptr, 0)
        if start <= t <= end:
            peak = max(peak, total)
    return peak


def local_state_bytes(model, optimizer) -> dict[str, int]:
    """Bytes of parameters, gradients and optimizer state held by this rank (shards only), measured after the first
    optimizer step; the sharding tests and the planner check against these."""
    def nbytes(t) -> int:
        t = t.to_local() if isinstance(t, DTensor) else t
        return t.numel() * t.element_size()

    named = list(model.named_parameters())
    state = optimizer.state
    return {
        "params": sum(nbytes(p) for _, p in named),
        "grads": sum(nbytes(p.grad) for _, p in named if p.grad is not None),
        "optimizer": sum(nbytes(v) for _, p in named for v in state.get(p, {}).values()
                         if torch.is_tensor(v) and v.dim() > 0),
        "block_matrix_params": sum(nbytes(p) for n, p in named if n.startswith("layers.") and p.dim() == 2),
    }
