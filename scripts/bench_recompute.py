"""Activation memory and step time per recompute mode (none / selective / full / full every 2).

One process. Activation memory is measured exactly: the bytes autograd keeps for backward (a saved-tensor hook
counts each saved storage once; checkpointed blocks keep only their inputs). Peak RSS growth during forward +
backward is sampled too, and CUDA max-allocated on a GPU. Run: python scripts/bench_recompute.py [--device cuda]
"""

from __future__ import annotations

import argparse
import os
import threading
import time

import psutil
import torch
import torch.distributed as dist
import torch.nn.functional as F

from llmtrain.config import compose_config
from llmtrain.parallel.build import build_parallel_model
from llmtrain.parallel.layout import ParallelDims
from llmtrain.parallel.mesh import build_mesh


class SavedBytes:
    """Bytes of distinct storages autograd saves for backward while active."""

    def __init__(self):
        self.storages: dict[int, int] = {}

    def pack(self, t: torch.Tensor):
        try:
            s = t.untyped_storage()
            self.storages[s.data_ptr()] = s.nbytes()
        except (RuntimeError, NotImplementedError):
            pass
        return t

    @property
    def total(self) -> int:
        return sum(self.storages.values())


def peak_rss_during(fn) -> tuple[float, int]:
    proc, peak, stop = psutil.Process(), [0], threading.Event()
    base = proc.memory_info().rss

    def sample():
        while not stop.is_set():
            peak[0] = max(peak[0], proc.memory_info().rss)
            time.sleep(0.002)

    thread = threading.Thread(target=sample)
    thread.start()
    start = time.perf_counter()
    fn()
    elapsed = time.perf_counter() - start
    stop.set()
    thread.join()
    return elapsed, max(0, peak[0] - base)


def measure(overrides: list[str], device: torch.device, batch: int, repeats: int) -> dict:
    cfg = compose_config(["cluster.nproc_per_node=1", *overrides])
    dims = ParallelDims.from_config(cfg)
    model = build_parallel_model(cfg, dims, build_mesh(dims, device.type), device).parts[0]
    x = torch.randint(0, cfg.model.vocab_size, (batch, cfg.model.seq_len), device=device)
    saved = SavedBytes()

    def step():
        with torch.autograd.graph.saved_tensors_hooks(saved.pack, lambda t: t):
            loss = F.cross_entropy(model(x).flatten(0, 1).float(), x.flatten())
        loss.backward()
        model.zero_grad(set_to_none=True)

    step()  # warm-up (allocator, kernels)
    times, rss = [], []
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    for _ in range(repeats):
        saved.storages.clear()
        t, r = peak_rss_during(step)
        times.append(t)
        rss.append(r)
    out = {"saved_mib": saved.total / 2**20, "step_s": min(times), "rss_growth_mib": min(rss) / 2**20}
    if device.type == "cuda":
        out["cuda_peak_mib"] = torch.cuda.max_memory_allocated() / 2**20
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29531")
    dist.init_process_group("gloo", rank=0, world_size=1)
    device = torch.device(args.device)
    model = [f"model.n_layers={args.layers}", f"model.d_model={args.width}", f"model.seq_len={args.seq}",
             "model.n_heads=4", f"device={args.device}"]
    modes = {"none": ["recompute=none"], "selective": ["recompute=selective"], "full": ["recompute=full"],
             "full every 2": ["recompute=full", "recompute.every=2"]}
    print(f"GPT {args.layers} layers x {args.width}, seq {args.seq}, batch {args.batch}, fp32, {args.device}")
    print(f"{'mode':<14}{'saved for backward':>20}{'vs none':>9}{'peak RSS growth':>17}{'fwd+bwd':>10}{'vs none':>9}")
    base = None
    for name, overrides in modes.items():
        r = measure(model + overrides, device, args.batch, args.repeats)
        base = base or r
        print(f"{name:<14}{r['saved_mib']:>16.1f} MiB{r['saved_mib'] / base['saved_mib'] - 1:>+9.0%}"
              f"{r['rss_growth_mib']:>13.1f} MiB{r['step_s']:>9.2f}s{r['step_s'] / base['step_s'] - 1:>+9.0%}",
              flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
