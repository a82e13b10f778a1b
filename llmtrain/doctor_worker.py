"""What `llmtrain doctor` runs on every rank (through the same backend as training): collect this rank's
versions, devices and network environment, and time all-reduces the way nccl-tests' all_reduce_perf does."""

from __future__ import annotations

import json
import os
import platform
import socket
import sys
import time

ENV_PREFIXES = ("NCCL_", "GLOO_", "CUDA_VISIBLE_DEVICES", "UCX_", "FI_", "TORCH_NCCL", "OMP_NUM_THREADS")


def facts(device) -> dict:
    import torch

    info = {"host": socket.gethostname(), "python": platform.python_version(), "torch": torch.__version__,
            "cuda": torch.version.cuda, "cuda_available": torch.cuda.is_available(),
            "devices": torch.cuda.device_count() if torch.cuda.is_available() else 0, "device": str(device),
            "nccl": None, "gpu": None,
            "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)}}
    if torch.cuda.is_available():
        info["nccl"] = ".".join(str(v) for v in torch.cuda.nccl.version())
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


def bandwidth(device, sizes: list[int], iters: int) -> list[dict]:
    """all_reduce (sum, fp32) timings; algbw = bytes / time, busbw = algbw * 2(n-1)/n (nccl-tests)."""
    import torch
    import torch.distributed as dist

    n = dist.get_world_size()
    rows = []
    for size in sizes:
        x = torch.ones(max(1, size // 4), dtype=torch.float32, device=device)
        for _ in range(2):
            dist.all_reduce(x)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        dist.barrier()
        start = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(x)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        elapsed = torch.tensor([(time.perf_counter() - start) / iters], dtype=torch.float64)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the slowest rank sets the pace
        t = elapsed.item()
        algbw = x.numel() * 4 / t / 1e9
        rows.append({"bytes": x.numel() * 4, "time_us": t * 1e6, "algbw_gbs": algbw,
                     "busbw_gbs": algbw * 2 * (n - 1) / n if n > 1 else 0.0})
    return rows


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    run_dir = os.path.abspath(argv[0])
    rank = int(os.environ.get("RANK", 0))

    from llmtrain.worker import _redirect_output

    os.makedirs(os.path.join(run_dir, "logs"), exist_ok=True)
    _redirect_output(os.path.join(run_dir, "logs", f"rank{rank}.log"))
    import torch.distributed as dist

    from llmtrain.config import load_run_config
    from llmtrain.train.trainer import resolve_device
    from llmtrain.worker import init_process_group

    cfg = load_run_config(os.path.join(run_dir, "config.yaml"))
    device = resolve_device(cfg.device, int(os.environ.get("LOCAL_RANK", 0)))
    init_process_group(device.type, cfg.launch.pg_timeout_s)
    with open(os.path.join(run_dir, "doctor_args.json")) as f:
        args = json.load(f)
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, facts(device))
    rows = bandwidth(device, args["sizes"], args["iters"])
    if rank == 0:
        tmp = os.path.join(run_dir, "doctor.json.tmp")
        with open(tmp, "w") as f:
            json.dump({"ranks": gathered, "all_reduce": rows, "world_size": dist.get_world_size()}, f, indent=1)
        os.replace(tmp, os.path.join(run_dir, "doctor.json"))
    print(f"llmtrain doctor: rank {rank} done", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
