"""Activation memory and step time per recompute mode (none / selective / full / full every 2).

One process. Activation memory is measured exactly: the bytes autograd keeps for backward (a saved-tensor hook
counts each saved storage once; checkpointed blocks keep only their inputs); on a GPU also CUDA max-allocated.
(RSS is not used: the CPU allocator keeps freed blocks, so RSS growth after a warm-up step says nothing.)
Step time is the fastest of --repeats forward + backward passes. Run: python scripts/bench_recompute.py
"""

from __future__ import annotations

import argparse
import os
import time

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
    times = []
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    for _ in range(repeats):
        saved.storages.clear()
        start = time.perf_counter()
        step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    out = {"saved_mib": saved.total / 2**20, "step_s": min(times)}
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
    print(f"{'mode':<14}{'saved for backward':>20}{'vs none':>9}{'fwd+bwd':>10}{'vs none':>9}"
          + (f"{'CUDA peak':>12}" if args.device == "cuda" else ""))
    base = None
    for name, overrides in modes.items():
        r = measure(model + overrides, device, args.batch, args.repeats)
        base = base or r
        print(f"{name:<14}{r['saved_mib']:>16.1f} MiB{r['saved_mib'] / base['saved_mib'] - 1:>+9.0%}"
              f"{r['step_s']:>9.2f}s{r['step_s'] / base['step_s'] - 1:>+9.0%}"
              + (f"{r['cuda_peak_mib']:>8.0f} MiB" if "cuda_peak_mib" in r else ""), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
