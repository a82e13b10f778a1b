"""How long training is blocked by an async checkpoint save (`checkpoint.async=true`), against a synchronous save
of the same state, on CPU.

One process builds the real trainer (a gloo process group of one rank) and trains a few steps so AdamW's moments
exist; then, alternating, it calls what the training loop calls at a checkpoint step (Trainer.save_checkpoint):

- sync: the call returns after the state is written: the whole save blocks training;
- async: the call returns once DCP has started the background copy (staging) and write; training then goes on,
  polling at each step boundary as the loop does, until the write is done. It waits for the copy before the next
  optimizer step changes the weights: that wait counts as blocked too.

Reported, medians over the repeats: the synchronous save, the time the async call blocks, their ratio (the target
is <= 10%), how long the background write took, and how much slower the training steps that ran during it were
than undisturbed steps (time the write took from training on a shared CPU, reported separately).

  python scripts/bench_async_save.py [--model gpt-125m] [--seq 64] [--repeats 3] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's llmtrain


def build_trainer(a, run_dir: str):
    import torch
    import torch.distributed as dist

    from llmtrain.config import compose_config
    from llmtrain.launch.config_probes import validate_here
    from llmtrain.train.device import resolve_device
    from llmtrain.train.trainer import Trainer

    cfg = compose_config([f"model={a.model}", f"model.seq_len={a.seq}", "train.micro_batch_size=1",
                          "train.global_batch_size=1", "train.max_steps=1000", f"device={a.device}",
                          "data=synthetic", "cluster.nproc_per_node=1", "checkpoint.resume=none",
                          "checkpoint.keep=1", f"run.dir={run_dir}", *a.overrides])
    validate_here(cfg)
    torch.manual_seed(cfg.train.seed)
    os.makedirs(run_dir, exist_ok=True)
    device = resolve_device(a.device, 0)
    backend = "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"  # as the worker does
    dist.init_process_group(backend, init_method=f"file://{run_dir}/pg-store", rank=0, world_size=1)
    return Trainer(cfg, run_dir, device)


def sync(trainer) -> None:
    if trainer.device.type == "cuda":
        import torch

        torch.cuda.synchronize()


def step(trainer) -> float:
    """One training step as the loop runs it (a step, then the checkpoint poll); its wall time."""
    start = time.perf_counter()
    trainer.train_step()  # reads the loss and gradient norm: the device has caught up when it returns
    trainer.state.step += 1
    trainer.ckpt.poll()
    return time.perf_counter() - start


def timed_save(trainer, asynchronous: bool) -> float:
    sync(trainer)
    start = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):  # the save's log lines
        trainer.save_checkpoint(asynchronous=asynchronous)
    return time.perf_counter() - start


def run_async(trainer) -> tuple[float, float, list[float]]:
    """(time training was blocked: the call plus the wait for the background copy before the next optimizer step,
    time until the background write finished, step times while it ran)."""
    ckpt, waited = trainer.ckpt, [0.0]
    wait_for_staging = ckpt.wait_for_staging

    def timed_wait() -> None:
        t0 = time.perf_counter()
        wait_for_staging()
        waited[0] += time.perf_counter() - t0

    ckpt.wait_for_staging = timed_wait
    start = time.perf_counter()
    blocked = timed_save(trainer, asynchronous=True)
    during = []
    with contextlib.redirect_stdout(io.StringIO()):
        while ckpt.pending is not None:
            during.append(step(trainer))
    ckpt.wait_for_staging = wait_for_staging
    return blocked + waited[0], time.perf_counter() - start, during


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="gpt-125m")
    p.add_argument("--seq", type=int, default=64, help="model.seq_len (short: steps stay around a second)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--warmup", type=int, default=3, help="steps before the first save (AdamW state exists)")
    p.add_argument("--baseline", type=int, default=5, help="undisturbed steps timed per repeat")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--workdir", default=None)
    p.add_argument("--json", default=None, help="also write the medians to this file")
    p.add_argument("overrides", nargs="*", help="more config overrides")
    a = p.parse_args()

    import torch

    with tempfile.TemporaryDirectory(prefix="bench-async-save-", dir=a.workdir) as tmp:
        trainer = build_trainer(a, os.path.join(tmp, "run"))
        n_params = sum(t.numel() for t in trainer.params)
        where = torch.cuda.get_device_name() if trainer.device.type == "cuda" else \
            f"CPU, {torch.get_num_threads()} threads"
        print(f"{a.model}: {n_params / 1e6:,.1f} M parameters (state ~{n_params * 12 / 2**30:.2f} GiB: fp32 weights "
              f"+ AdamW moments), seq {a.seq}, micro-batch 1, {where}, torch {torch.__version__}", flush=True)
        for _ in range(a.warmup):
            step(trainer)
        sync, blocked, background, base, during = [], [], [], [], []
        for i in range(a.repeats):
            base += [step(trainer) for _ in range(a.baseline)]
            sync.append(timed_save(trainer, asynchronous=False))
            step(trainer)  # a new step number for the next checkpoint folder
            b, total, steps = run_async(trainer)
            blocked.append(b)
            background.append(total)
            during += steps
            print(f"  repeat {i + 1}: sync save {sync[-1]:.2f} s; async call blocked {b:.2f} s "
                  f"({b / sync[-1]:.1%}), background write done after {total:.2f} s, {len(steps)} step(s) ran "
                  f"during it", flush=True)
        s, b = statistics.median(sync), statistics.median(blocked)
        step_base = statistics.median(base)
        step_during = statistics.median(during) if during else float("nan")
        print(f"\nmedians over {a.repeats} repeats")
        print(f"  synchronous save                 {s:8.2f} s")
        fractions = [x / y for x, y in zip(blocked, sync)]
        print(f"  async save: training blocked     {b:8.2f} s   ({b / s:.1%} of the synchronous save; target <= 10%; "
              f"per repeat {min(fractions):.1%} to {max(fractions):.1%}, median {statistics.median(fractions):.1%})")
        print(f"  async save: background write     {statistics.median(background):8.2f} s")
        print(f"  step time undisturbed            {step_base:8.2f} s")
        print(f"  step time during the write       {step_during:8.2f} s   "
              f"({step_during / step_base - 1:+.0%}: the write shares the CPU with training)")
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"sync_s": s, "blocked_s": b, "blocked_fraction": b / s, "per_repeat": fractions,
                           "background_s": statistics.median(background), "step_s": step_base,
                           "step_during_write_s": step_during, "repeats": a.repeats}, f)
        import torch.distributed as dist

        dist.destroy_process_group()
    return 0 if b <= 0.10 * s else 1


if __name__ == "__main__":
    sys.exit(main())
