"""`llmtrain doctor [OVERRIDES]`: a preflight on every node of the configured cluster before a long job.

In order: the tools this node needs (ssh, sbatch); whether every node can be used (ssh: each host answers;
Slurm: enough nodes of the partition are up, see node_availability), before any job starts; then a short job
through the same backend as `launch` (the same hosts, environment and rendezvous) that reports versions (Python,
torch, CUDA, NCCL) and whether they agree, accelerators per rank, the interface and address each node's
collectives use, and all-reduce and all-to-all bandwidth within nodes, across nodes and over all ranks. Exits 1 on
a problem.

Each check gets a folder of its own, doctor.dir/<YYYYmmdd-HHMMSS>/ (config.yaml, logs/, report.json): doctor
never writes into a run directory nor takes its lock, so it can run beside a job. It reads one: the hosts the
configured run.dir's nodes.json holds bad are named first (ledger_marks.py).
"""

from __future__ import annotations

import json
import os
import shutil
import time

from omegaconf import DictConfig

from llmtrain.config import to_yaml
from llmtrain.config.errors import ConfigError
from llmtrain.console import get_console, plain, say
from llmtrain.doctor.all_to_all_sweeps import all_to_all_sizes
from llmtrain.doctor.ledger_marks import ledger_lines
from llmtrain.doctor.node_availability import nodes_ready
from llmtrain.doctor.findings import problems, render
from llmtrain.errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK
from llmtrain.launch.backends.registry import get_backend
from llmtrain.launch.backends.traits import traits_of
from llmtrain.launch.supervision.monitor import Monitor
from llmtrain.rundir.atomic import atomic_write_json
from llmtrain.rundir.paths import RunPaths

WORKER = "llmtrain.doctor.rank_probe"
EXIT_PROBLEM = EXIT_FAILED


def results_dir(base: str, now: float | None = None) -> str:
    """A new, empty folder base/<YYYYmmdd-HHMMSS> (-2, -3, ... when that second is taken)."""
    stamp = os.path.join(os.path.abspath(base), time.strftime("%Y%m%d-%H%M%S", time.localtime(now)))
    path, n = stamp, 1
    while True:
        try:
            os.makedirs(path)
            return path
        except FileExistsError:
            n += 1
            path = f"{stamp}-{n}"
        except OSError as e:
            raise ConfigError("doctor.dir", f"cannot create {path}: {e.strerror or e}") from None


def sweep_sizes(cfg: DictConfig, max_bytes: int | None) -> list[int]:
    if max_bytes is None:
        max_bytes = 256 * 2**20 if cfg.device == "cuda" else 16 * 2**20
    return [s for s in (2**k for k in range(10, 31, 2)) if s <= max_bytes]


def prepare(cfg: DictConfig, out_dir: str, sizes: list[int], iters: int) -> None:
    """What the ranks read: the resolved config (whose run.dir is this folder) and the sweeps' arguments."""
    paths = RunPaths(out_dir)
    os.makedirs(paths.logs)
    with open(paths.config, "w") as f:
        f.write(to_yaml(cfg))
    with open(os.path.join(out_dir, "doctor_args.json"), "w") as f:
        json.dump({"sizes": sizes, "all_to_all_sizes": all_to_all_sizes(sizes), "iters": iters}, f)


def record_verdict(path: str, found: list[str]) -> None:
    """Add the problems and "ok" to the ranks' report.json (rank 0 wrote it without them)."""
    with open(path) as f:
        report = json.load(f)
    report.update(problems=found, ok=not found)
    atomic_write_json(path, report, indent=1)


def run_doctor(cfg: DictConfig, max_bytes: int | None, iters: int) -> int:
    console = get_console()
    if traits_of(cfg.cluster.name).queued:
        cfg.cluster.follow = True  # the report needs the job to finish
        cfg.cluster.requeue = False  # a preflight is run again by hand, never by Slurm
        cfg.cluster.job_name = cfg.cluster.job_name or "llmtrain-doctor"
    # The backend is built once for its checks (tools on PATH, the hostfile) before anything is written.
    get_backend(cfg, os.path.abspath(cfg.doctor.dir), worker_module=WORKER).check_ready()
    for line in ledger_lines(cfg):  # the configured run.dir's record, before run.dir becomes doctor's folder
        say(line)
    if not nodes_ready(cfg, console):
        return EXIT_PROBLEM
    out_dir = cfg.run.dir = results_dir(cfg.doctor.dir)
    prepare(cfg, out_dir, sweep_sizes(cfg, max_bytes), iters)
    backend = get_backend(cfg, out_dir, worker_module=WORKER)
    plain(f"llmtrain doctor: {cfg.cluster.nnodes} node(s) x {cfg.cluster.nproc_per_node} process(es) via "
          f"{backend.name}; results in {out_dir}", console=console)
    try:
        code = backend.run(Monitor(out_dir, 1, console))
    except ConfigError:  # refused before anything ran (sbatch): nothing to keep
        shutil.rmtree(out_dir, ignore_errors=True)
        raise
    except KeyboardInterrupt:
        backend.stop()
        plain(f"llmtrain doctor: interrupted; logs in {RunPaths(out_dir).logs}", console=console)
        return EXIT_INTERRUPTED
    path = os.path.join(out_dir, "report.json")
    if code != 0 or not os.path.exists(path):
        if os.path.exists(path):  # rank 0 got that far, but the job did not end well: never a success
            record_verdict(path, [f"the preflight job failed (exit code {code})"])
        console.print(f"[bold red]llmtrain doctor: the preflight job failed (exit code {code}); see "
                      f"{RunPaths(out_dir).logs}[/]", highlight=False, soft_wrap=True)
        return EXIT_PROBLEM
    with open(path) as f:
        report = json.load(f)
    render(report, console)
    found = problems(report, cfg)
    record_verdict(path, found)
    for p in found:
        console.print(f"[bold red]problem:[/] {p}", highlight=False, soft_wrap=True)
    if not found:
        console.print("[bold green]llmtrain doctor: all ranks agree; collectives work[/]")
    plain(f"llmtrain doctor: report in {path}", console=console)
    return EXIT_PROBLEM if found else EXIT_OK
