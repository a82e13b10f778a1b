"""What `llmtrain doctor` runs on every rank (through the same backend as training): collect this rank's
versions, devices, network environment and the interface its collectives use, then time all-reduces and
all-to-alls within each node, across nodes and over all ranks (all_reduce_sweeps). Rank 0 writes
DOCTOR_DIR/report.json."""

from __future__ import annotations

import json
import os
import platform
import socket
import sys

from llmtrain.rundir.atomic import atomic_write_json
from llmtrain.rundir.paths import RunPaths

ENV_PREFIXES = ("NCCL_", "GLOO_", "CUDA_VISIBLE_DEVICES", "UCX_", "FI_", "TORCH_NCCL", "OMP_NUM_THREADS")


def interfaces(device) -> list[dict]:
    """The interface and address of each backend this rank's collectives go through: gloo always (CPU
    collectives, checkpoint coordination), NCCL too on CUDA."""
    from llmtrain.launch.node.collective_interface import collective_interface

    master = os.environ.get("MASTER_ADDR", "127.0.0.1")
    found = []
    for backend, var in (("nccl", "NCCL_SOCKET_IFNAME"), ("gloo", "GLOO_SOCKET_IFNAME")):
        if backend == "gloo" or device.type == "cuda":
            found.append({"backend": backend, **collective_interface(var, os.environ.get(var), master)})
    return found


def facts(device) -> dict:
    import torch

    info = {"host": socket.gethostname(), "node": int(os.environ.get("GROUP_RANK", 0)),
            "local_rank": int(os.environ.get("LOCAL_RANK", 0)), "python": platform.python_version(),
            "torch": torch.__version__, "cuda": torch.version.cuda, "cuda_available": torch.cuda.is_available(),
            "devices": torch.cuda.device_count() if torch.cuda.is_available() else 0, "device": str(device),
            "nccl": None, "gpu": None, "interfaces": interfaces(device),
            "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)}}
    if torch.cuda.is_available():
        info["nccl"] = ".".join(str(v) for v in torch.cuda.nccl.version())
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


def write_report(out_dir: str, report: dict) -> None:
    atomic_write_json(os.path.join(out_dir, "report.json"), report, indent=1)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    out_dir = os.path.abspath(argv[0])
    rank = int(os.environ.get("RANK", 0))

    from llmtrain.worker import redirect_output

    paths = RunPaths(out_dir)  # laid out as a run directory: the launcher's backends run it as one
    os.makedirs(paths.logs, exist_ok=True)
    redirect_output(paths.rank_log(rank))
    import torch.distributed as dist

    from llmtrain.config import load_run_config
    from llmtrain.doctor.all_reduce_sweeps import run_sweeps
    from llmtrain.train.device import resolve_device
    from llmtrain.worker import init_process_group

    cfg = load_run_config(paths.config)
    device = resolve_device(cfg.device, int(os.environ.get("LOCAL_RANK", 0)))
    init_process_group(device.type, cfg.launch.pg_timeout_s)
    with open(os.path.join(out_dir, "doctor_args.json")) as f:
        args = json.load(f)
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, facts(device))
    placement = [(r["node"], r["local_rank"]) for r in gathered]
    sweeps = run_sweeps(device, placement, args["sizes"], args["all_to_all_sizes"], args["iters"])
    if rank == 0:
        write_report(out_dir, {"ranks": gathered, "world_size": dist.get_world_size(), "sizes": args["sizes"],
                               "all_to_all_sizes": args["all_to_all_sizes"], "iters": args["iters"], **sweeps})
    print(f"llmtrain doctor: rank {rank} done", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
