"""`llmtrain doctor [OVERRIDES]`: a preflight on every node of the configured cluster before a long job.

Starts a short job through the same backend as `launch` (so the same hosts, environment and rendezvous are
exercised), then reports: versions (Python, torch, CUDA, NCCL) and whether they agree, accelerators per rank,
the effective network environment per node, and an all-reduce bandwidth sweep (bus bandwidth as nccl-tests
computes it). Exits 1 on a problem.
"""

from __future__ import annotations

import json
import os
import shutil

from omegaconf import DictConfig
from rich.console import Console

from llmtrain.console import fold_table, get_console
from llmtrain.launch.backend import get_backend
from llmtrain.launch.monitor import Monitor
from llmtrain.launch.run import prepare_run_dir


def problems(report: dict, cfg: DictConfig) -> list[str]:
    out = []
    ranks = report["ranks"]
    expected = cfg.cluster.nnodes * cfg.cluster.nproc_per_node
    if len(ranks) != expected:
        out.append(f"{len(ranks)} ranks answered, {expected} expected")
    for key in ("python", "torch", "cuda", "nccl"):
        values = {r[key] for r in ranks}
        if len(values) > 1:
            where = ", ".join(f"{r['host']}={r[key]}" for r in ranks)
            out.append(f"{key} versions differ across ranks: {where}")
    want_cuda = cfg.device == "cuda" or (cfg.device == "auto" and any(r["cuda_available"] for r in ranks))
    missing = sorted({r["host"] for r in ranks if want_cuda and not r["cuda_available"]})
    if missing:
        out.append(f"no CUDA device visible on {', '.join(missing)}")
    envs = {}
    for r in ranks:
        envs.setdefault(r["host"], r["env"])
    nccl_keys = {k for env in envs.values() for k in env if k.startswith("NCCL_")}
    for key in sorted(nccl_keys):
        values = {env.get(key) for env in envs.values()}
        if len(values) > 1:
            out.append(f"{key} differs across nodes: {values}")
    return out


def render(report: dict, console: Console) -> None:
    ranks = fold_table("ranks")
    for col in ("rank", "host", "python", "torch", "cuda", "nccl", "device", "gpu"):
        ranks.add_column(col)
    for i, r in enumerate(report["ranks"]):
        ranks.add_row(str(i), r["host"], r["python"], r["torch"], str(r["cuda"]), str(r["nccl"]), r["device"],
                      str(r["gpu"] or "-"))
    console.print(ranks)
    seen = set()
    for r in report["ranks"]:
        if r["host"] in seen:
            continue
        seen.add(r["host"])
        env = " ".join(f"{k}={v}" for k, v in r["env"].items()) or "(none set)"
        console.print(f"network environment on {r['host']}: {env}", markup=False, highlight=False)
    bw = fold_table(f"all_reduce, {report['world_size']} ranks (sum, fp32; busbw = algbw x 2(n-1)/n)")
    for col in ("bytes", "time (us)", "algbw (GB/s)", "busbw (GB/s)"):
        bw.add_column(col, justify="right")
    for row in report["all_reduce"]:
        bw.add_row(f"{row['bytes']:,}", f"{row['time_us']:,.1f}", f"{row['algbw_gbs']:.3f}",
                   f"{row['busbw_gbs']:.3f}")
    console.print(bw)


def run_doctor(cfg: DictConfig, max_bytes: int | None, iters: int) -> int:
    console = get_console()
    cfg.run.dir = os.path.join(os.path.abspath(cfg.run.dir), "doctor")
    if cfg.cluster.name == "slurm":
        cfg.cluster.follow = True  # the report needs the job to finish
    get_backend(cfg, cfg.run.dir, worker_module="llmtrain.doctor_worker").check_ready()
    shutil.rmtree(cfg.run.dir, ignore_errors=True)
    run_dir = prepare_run_dir(cfg)
    if max_bytes is None:
        max_bytes = 256 * 2**20 if cfg.device == "cuda" else 16 * 2**20
    sizes = [s for s in (2**k for k in range(10, 31, 2)) if s <= max_bytes]
    with open(os.path.join(run_dir, "doctor_args.json"), "w") as f:
        json.dump({"sizes": sizes, "iters": iters}, f)
    backend = get_backend(cfg, run_dir, worker_module="llmtrain.doctor_worker")
    console.print(f"llmtrain doctor: {cfg.cluster.nnodes} node(s) x {cfg.cluster.nproc_per_node} process(es) "
                  f"via {backend.name}; results in {run_dir}", markup=False, highlight=False)
    monitor = Monitor(run_dir, 1, console)
    try:
        code = backend.run(monitor)
    except KeyboardInterrupt:
        backend.stop()
        return 130
    path = os.path.join(run_dir, "doctor.json")
    if code != 0 or not os.path.exists(path):
        console.print(f"[bold red]llmtrain doctor: the preflight job failed (exit code {code}); see "
                      f"{os.path.join(run_dir, 'logs')}[/]")
        return 1
    with open(path) as f:
        report = json.load(f)
    render(report, console)
    found = problems(report, cfg)
    for p in found:
        console.print(f"[bold red]problem:[/] {p}", highlight=False)
    if not found:
        console.print("[bold green]llmtrain doctor: all ranks agree; collectives work[/]")
    return 1 if found else 0
