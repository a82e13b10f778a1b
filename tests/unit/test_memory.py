"""The CPU peak-memory probe behind `profile.memory` and the planner's accuracy check."""

import torch

from llmtrain.train.memory import PeakMemory


def test_cpu_peak_is_the_highest_live_total_inside_the_measured_steps():
    probe = PeakMemory(torch.device("cpu"), enabled=True, steps=2)
    before = torch.ones(1 << 20)  # 4 MiB allocated before the window: live during it, so it counts
    probe.before_step(1)
    a = torch.ones(2 << 20)  # +8 MiB -> 12
    del a  # -> 4
    b = torch.ones(1 << 20)  # -> 8
    c = torch.ones(1 << 20)  # -> 12
    del b, c
    probe.after_step(1)
    assert probe.peak_bytes is None  # measured over both steps
    d = torch.ones(3 << 20)  # 4 + 12 = 16 MiB: the peak
    del d
    probe.after_step(2)
    assert probe.peak_bytes is not None
    assert abs(probe.peak_bytes - 16 * 2**20) <= 64 * 1024, probe.peak_bytes
    del before


def test_off_on_cpu_measures_nothing():
    probe = PeakMemory(torch.device("cpu"), enabled=False, steps=1)
    probe.before_step(1)
    probe.after_step(1)
    assert probe.peak_bytes is None


def test_an_address_handed_out_again_counts_as_the_unrecorded_free():
    from types import SimpleNamespace as NS

    from torch._C._profiler import _EventType

    from llmtrain.train.memory import WINDOW_EVENT, cpu_peak

    def alloc(t, ptr, size):
        return NS(name="[memory]", tag=_EventType.Allocation, start_time_ns=t, children=[],
                  extra_fields=NS(ptr=ptr, alloc_size=size, device=torch.device("cpu")))

    window = NS(name=WINDOW_EVENT, tag=_EventType.TorchOp, start_time_ns=0, end_time_ns=100, children=[])
    # 0x10 is freed on another thread (no event) and reused: live is 4 + 4, not 4 + 4 + 4.
    events = [window, alloc(1, 0x10, 4), alloc(2, 0x20, 4), alloc(3, 0x10, 4), alloc(4, 0x20, -4)]
    result = NS(experimental_event_tree=lambda: events)
    assert cpu_peak(result) == 8
