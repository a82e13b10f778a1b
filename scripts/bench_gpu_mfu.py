"""Tokens/s and MFU of gpt-1.3b in bf16 on one GPU (H100/H200 class), through `llmtrain launch`.

Runs `python -m llmtrain launch model=gpt-1.3b precision=bf16 device=cuda data=synthetic cluster.nproc_per_node=1
hardware=auto ...` with log_interval=1, no eval and no checkpoint, then reads RUN_DIR/metrics.jsonl:

- tokens/s: median of the per-step `tokens_per_s` rows after the first `--skip` (warm-up) steps;
- MFU, computed here: flops_per_token x tokens/s / (world size x peak), where flops_per_token is
  llmtrain.plan.estimate.flops_per_token (6 x (non-embedding params + d x padded V) + 6 x L x s x d; recompute is
  not counted) and the peak is the dense bf16 peak of the detected GPU from configs/hardware/*.yaml
  (H100/H200: 989 TFLOPS), or --peak-tflops;
- the median of the trainer's own `mfu` field too, when metrics.jsonl has one (they should agree).

Both MFU lines name the peak they are against (`MFU (this script) N% of 989 TFLOPS bf16`). `llmtrain plan` with the
same overrides gives the run's memory before it starts; raise --micro (or add --recompute selective) where it fits.

  python scripts/bench_gpu_mfu.py [--micro 4] [--global-batch 8] [--steps 30] [--skip 10] [--recompute none]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="gpt-1.3b")
    p.add_argument("--micro", type=int, default=4, help="train.micro_batch_size")
    p.add_argument("--global-batch", type=int, default=8, help="train.global_batch_size")
    p.add_argument("--seq", type=int, default=2048, help="model.seq_len")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--skip", type=int, default=10, help="warm-up steps left out of the medians")
    p.add_argument("--recompute", default="none", choices=["none", "selective", "full"])
    p.add_argument("--peak-tflops", type=float, default=None,
                   help="dense bf16 peak for this script's MFU (default: from the GPU name); an unknown GPU needs it")
    p.add_argument("--run-dir", default=None, help="keep the run here (default: a temporary directory)")
    p.add_argument("--timeout", type=int, default=600)
    p.add_argument("extra", nargs="*", help="more config overrides, e.g. optim.fused=torch train.compile=true")
    a = p.parse_args()

    import torch

    if not torch.cuda.is_available():
        print("bench_gpu_mfu: CUDA is not available (torch.cuda.is_available() is False); this benchmark needs "
              "an NVIDIA GPU", file=sys.stderr)
        return 1

    from llmtrain.config import ConfigError, compose_config
    from llmtrain.hardware.profiles import load_profile
    from llmtrain.plan.estimate import flops_per_token, stage_params
    from llmtrain.hardware.profiles import resolve

    ov = [f"model={a.model}", "precision=bf16", "cluster.nproc_per_node=1", "device=cuda", "data=synthetic",
          f"model.seq_len={a.seq}", f"train.micro_batch_size={a.micro}", f"train.global_batch_size={a.global_batch}",
          f"train.max_steps={a.steps}", "train.log_interval=1", "train.eval_interval=0", "checkpoint.at_end=false",
          "checkpoint.resume=none", f"recompute={a.recompute}", "hardware=auto", *a.extra]
    if a.peak_tflops:  # the trainer uses it too, in place of the detected profile's
        ov.append(f"+hardware.peak_tflops.bfloat16={a.peak_tflops}")
    cfg = compose_config(ov)
    _, params, non_embedding = stage_params(cfg)
    fpt = flops_per_token(cfg, non_embedding)
    try:
        hw = resolve(cfg.hardware, cfg.precision.compute_dtype, load_profile)
    except ConfigError as e:  # a GPU without bf16
        print(f"bench_gpu_mfu: {e}", file=sys.stderr)
        return 1
    if hw["peak_tflops"] is None:
        print(f"bench_gpu_mfu: no hardware profile matches {hw['device']}; pass --peak-tflops", file=sys.stderr)
        return 1
    peak = hw["peak_tflops"] * 1e12
    world = cfg.cluster.nproc_per_node * cfg.cluster.nnodes
    print(f"{torch.cuda.get_device_name()} ({hw['name']}, peak {peak / 1e12:,.0f} TFLOPS bf16 dense); "
          f"{a.model}: {params / 1e9:.2f}B params, {fpt / 1e9:.2f} GFLOP/token; micro {a.micro} x seq {a.seq}, "
          f"global {a.global_batch}, recompute={a.recompute}, {a.steps} steps", flush=True)

    with tempfile.TemporaryDirectory(prefix="bench-mfu-") as tmp:
        run_dir = os.path.abspath(a.run_dir or os.path.join(tmp, "run"))
        argv = [sys.executable, "-m", "llmtrain", "launch", f"run.dir={run_dir}", *ov]
        print("$ " + " ".join(argv), flush=True)
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=a.timeout)
        except subprocess.TimeoutExpired:
            print(f"bench_gpu_mfu: the run took over {a.timeout} s", file=sys.stderr)
            return 1
        if proc.returncode:
            log = os.path.join(run_dir, "logs", "rank0.log")
            tail = open(log).read()[-4000:] if os.path.exists(log) else ""
            print(f"bench_gpu_mfu: llmtrain launch failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n"
                  f"{proc.stderr[-2000:]}\n--- rank0.log ---\n{tail}", file=sys.stderr)
            return 1
        with open(os.path.join(run_dir, "metrics.jsonl")) as f:
            rows = [json.loads(line) for line in f if line.strip()]
    rows = [r for r in rows if "tokens_per_s" in r and r["step"] > a.skip]
    if not rows:
        print(f"bench_gpu_mfu: no steps after the first {a.skip} in metrics.jsonl", file=sys.stderr)
        return 1
    tps = statistics.median(r["tokens_per_s"] for r in rows)
    mfu = fpt * tps / (world * peak)
    print(f"\nsteps {rows[0]['step']}..{rows[-1]['step']} (medians)")
    print(f"  tokens/s          {tps:,.0f}")
    print(f"  step time         {statistics.median(r['step_time_s'] for r in rows):.3f} s")
    print(f"  model TFLOPS/GPU  {fpt * tps / world / 1e12:,.1f}")
    print(f"  MFU (this script) {mfu:.1%} of {peak / 1e12:,.0f} TFLOPS bf16")
    if all("mfu" in r and "peak_tflops" in r for r in rows):  # the trainer's, against the peak it recorded
        print(f"  MFU (metrics)     {statistics.median(r['mfu'] for r in rows):.1%} of "
              f"{rows[-1]['peak_tflops']:,.0f} TFLOPS bf16")
    if any("mem_gib" in r for r in rows):
        print(f"  peak memory       {max(r.get('mem_gib', 0) for r in rows):.1f} GiB (max allocated)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
