"""profile.steps: a torch.profiler trace of a window of steps."""

from __future__ import annotations

import os

import torch


class StepProfiler:
    """profile.steps=[A, B]: a torch.profiler trace of steps A..B, written per rank as a Chrome trace."""

    def __init__(self, steps, out_dir: str, rank: int, device: torch.device):
        self.window = tuple(steps) if steps else None
        self.path = os.path.join(out_dir, f"rank{rank}.trace.json")
        self.device = device
        self.prof = None

    def before_step(self, step: int) -> None:
        if self.window and step == self.window[0]:
            from torch.profiler import ProfilerActivity, profile

            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.device.type == "cuda" else [])
            self.prof = profile(activities=activities, record_shapes=True, with_stack=False)
            self.prof.__enter__()

    def after_step(self, step: int) -> None:
        if self.prof is not None and step == self.window[1]:
            self.prof.__exit__(None, None, None)
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            self.prof.export_chrome_trace(self.path)
            self.prof = None
            print(f"llmtrain: profiler trace of steps {self.window[0]}-{self.window[1]} -> {self.path}", flush=True)
