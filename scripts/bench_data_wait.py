"""How long a training step waits for its data under data=mix (data_wait_ms: fetching this rank's batches from
the memory-mapped shards and copying them to the device), against the step time; the target is under 1%.

One process builds the real trainer (a gloo process group of one rank) on a mixture of 4 sources of 2 shards
each (8 shard files, written here with random tokens), trains a few steps as the loop does and prints, per step,
the data wait and the step time, then the medians and their ratio.

  python scripts/bench_data_wait.py [--model gpt-125m] [--seq 256] [--batch 4] [--steps 4] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's llmtrain

SOURCES = {"web": 0.5, "code": 0.25, "books": 0.15, "math": 0.10}
SHARD_TOKENS = 2_000_000


def write_sources(folder: str, vocab: int) -> list[str]:
    """One folder of 2 uint16 shards (with index.json) per source: 8 shard files in all."""
    import numpy as np

    rng = np.random.default_rng(0)
    entries = []
    for name, weight in SOURCES.items():
        source = os.path.join(folder, name)
        os.makedirs(source, exist_ok=True)
        shards = []
        for i in range(2):
            file = f"shard-{i:05d}.bin"
            rng.integers(0, vocab, SHARD_TOKENS, dtype=np.uint16).tofile(os.path.join(source, file))
            shards.append({"file": file, "num_tokens": SHARD_TOKENS})
        with open(os.path.join(source, "index.json"), "w") as f:
            json.dump({"format": "llmtrain-shards-v1", "dtype": "uint16", "vocab_size": vocab,
                       "num_tokens": 2 * SHARD_TOKENS, "shards": shards}, f)
        entries.append(f"{{path: {source}, weight: {weight}}}")
    return entries


def build_trainer(a, run_dir: str, sources: list[str]):
    import torch
    import torch.distributed as dist

    from llmtrain.config import compose_config, validate
    from llmtrain.train.device import resolve_device
    from llmtrain.train.trainer import Trainer

    cfg = compose_config([f"model={a.model}", f"model.seq_len={a.seq}", "train.micro_batch_size=1",
                          f"train.global_batch_size={a.batch}", "train.max_steps=1000", f"device={a.device}",
                          "data=mix", f"data.sources=[{', '.join(sources)}]", "cluster.nproc_per_node=1",
                          "checkpoint.resume=none", f"run.dir={run_dir}"])
    validate(cfg)
    torch.manual_seed(cfg.train.seed)
    device = resolve_device(a.device, 0)
    backend = "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"  # as the worker does
    dist.init_process_group(backend, init_method=f"file://{run_dir}/pg-store", rank=0, world_size=1)
    return Trainer(cfg, run_dir, device)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt-125m")
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--batch", type=int, default=4, help="global batch (micro-batches of 1)")
    parser.add_argument("--steps", type=int, default=4, help="timed steps, after one warm-up step")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--workdir", default=None)
    a = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with tempfile.TemporaryDirectory(dir=a.workdir) as work:
        sources = write_sources(os.path.join(work, "data"), vocab=50257)
        run_dir = os.path.join(work, "run")
        os.makedirs(run_dir)
        trainer = build_trainer(a, run_dir, sources)
        t = trainer.cfg.train
        waits, steps = [], []
        for i in range(a.steps + 1):
            start = time.perf_counter()
            trainer.train_step()
            elapsed = time.perf_counter() - start
            state = trainer.state
            state.advance(t.global_batch_size, 0)
            trainer.feed.step_done(state.step, state.samples_seen - t.global_batch_size, state.samples_seen)
            wait_ms = trainer.feed.take_wait_ms()
            if i:  # the first step pays for warm-up (page faults, allocator)
                waits.append(wait_ms)
                steps.append(elapsed * 1000)
            print(f"step {trainer.step}: data_wait {wait_ms:.3f} ms, step {elapsed * 1000:.0f} ms"
                  + ("" if i else " (warm-up, not counted)"), flush=True)
        wait, step = statistics.median(waits), statistics.median(steps)
        print(f"{a.model}, seq_len {a.seq}, {a.batch} samples/step from 8 shards of 4 sources on "
              f"{trainer.device.type}: median data_wait {wait:.3f} ms of a {step:.0f} ms step = "
              f"{wait / step:.4%} (target < 1%)", flush=True)
        trainer.metrics.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
