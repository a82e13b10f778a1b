"""What `llmtrain launch` adds over a bare torchrun of the same worker: time to the first logged step and total.

Both sides train the same short run (default: gpt-tiny, 5 steps, log_interval=1, no eval, no checkpoint) on CPU:

- bare: before the clock starts, RUN_DIR/config.yaml is written by `python -m llmtrain config OVERRIDES` and
  RUN_DIR/logs is created; then the clock runs over
  `python -m torch.distributed.run --standalone --nproc-per-node=N -m llmtrain.worker RUN_DIR`, with the
  environment the local launcher gives its workers (`worker_env(cfg)`: OMP_NUM_THREADS = cores / N,
  PYTHONUNBUFFERED, TORCH_DISABLE_SHARE_RDZV_TCP_STORE, PYTHONPATH; plus TMPDIR=RUN_DIR/tmp).
- launch: the clock runs over `python -m llmtrain launch OVERRIDES` (config composition, run-dir preparation,
  c10d rendezvous on a free port, the monitor, and stopping the process tree at the end all count).

For each: seconds from starting the process to RUN_DIR/metrics.jsonl holding its first row (polled every 5 ms),
and to the process exiting. nproc 1 and 2, `--repeats` each (the order alternates), medians; the difference is
llmtrain's overhead. `llmtrain config` time is left out of the bare side (launch pays for the same composition).

  python scripts/bench_launch_overhead.py [OVERRIDE ...] [--nproc 1 2] [--steps 5] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time


def overrides(run_dir: str, nproc: int, steps: int, extra: list[str]) -> list[str]:
    return [f"run.dir={run_dir}", f"cluster.nproc_per_node={nproc}", f"train.max_steps={steps}",
            "train.log_interval=1", "train.eval_interval=0", "checkpoint.at_end=false", "checkpoint.resume=none",
            "device=cpu", *extra]


def timed(argv: list[str], env: dict, metrics: str) -> tuple[float, float]:
    """(seconds to the first metrics row, seconds to exit) of argv."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    first = None
    while proc.poll() is None:
        if first is None and os.path.exists(metrics) and os.path.getsize(metrics) > 0:
            first = time.perf_counter() - start
        time.sleep(0.005)
    total = time.perf_counter() - start
    if first is None and os.path.exists(metrics) and os.path.getsize(metrics) > 0:
        first = total  # finished between two polls
    err = proc.stderr.read()
    if proc.returncode or first is None:
        sys.exit(f"{' '.join(argv)} failed (exit {proc.returncode}, first row {first}):\n{err[-3000:]}")
    return first, total


def run_bare(run_dir: str, nproc: int, steps: int, extra: list[str]) -> tuple[float, float]:
    from llmtrain.config import compose_config
    from llmtrain.launch.backends.base import worker_env

    ov = overrides(run_dir, nproc, steps, extra)
    os.makedirs(os.path.join(run_dir, "logs"))
    os.makedirs(os.path.join(run_dir, "tmp"))
    with open(os.path.join(run_dir, "config.yaml"), "w") as f:
        subprocess.run([sys.executable, "-m", "llmtrain", "config", *ov], stdout=f, check=True)
    env = dict(os.environ, **worker_env(compose_config(ov)), TMPDIR=os.path.join(run_dir, "tmp"))
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
            "-m", "llmtrain.worker", run_dir]
    return timed(argv, env, os.path.join(run_dir, "metrics.jsonl"))


def run_launch(run_dir: str, nproc: int, steps: int, extra: list[str]) -> tuple[float, float]:
    argv = [sys.executable, "-m", "llmtrain", "launch", *overrides(run_dir, nproc, steps, extra)]
    return timed(argv, dict(os.environ), os.path.join(run_dir, "metrics.jsonl"))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nproc", type=int, nargs="+", default=[1, 2])
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("extra", nargs="*", help="more config overrides for both sides (e.g. model.d_model=64)")
    a = p.parse_args()

    from llmtrain.config import compose_config
    from llmtrain.data import ensure_stdlib_corpus

    cfg = compose_config(a.extra)
    if cfg.data.name == "stdlib":  # build the corpus once, outside every timing
        ensure_stdlib_corpus(cfg.data.path, cfg.data.max_bytes)
    print(f"{cfg.model.name}, {a.steps} steps, log_interval=1, CPU; {a.repeats} repeats; "
          f"extra overrides: {' '.join(a.extra) or 'none'}", flush=True)
    runners = {"bare": run_bare, "launch": run_launch}
    table = []
    for nproc in a.nproc:
        res = {"bare": [], "launch": []}
        for i in range(a.repeats):
            for side in (["bare", "launch"] if i % 2 == 0 else ["launch", "bare"]):
                with tempfile.TemporaryDirectory(prefix="bench-launch-") as tmp:
                    first, total = runners[side](os.path.join(tmp, "run"), nproc, a.steps, a.extra)
                res[side].append((first, total))
                print(f"  nproc {nproc} repeat {i + 1} {side:<6}  first step {first:6.2f} s   total {total:6.2f} s",
                      flush=True)
        table.append((nproc, *(statistics.median(r[k] for r in res[s]) for k in (0, 1) for s in ("bare", "launch"))))
    print(f"\n{'nproc':>5} | {'first step: bare':>16} {'launch':>7} {'overhead':>9} | "
          f"{'total: bare':>11} {'launch':>7} {'overhead':>9}   (medians, seconds)")
    for nproc, fb, fl, tb, tl in table:
        print(f"{nproc:>5} | {fb:>16.2f} {fl:>7.2f} {fl - fb:>+9.2f} | {tb:>11.2f} {tl:>7.2f} {tl - tb:>+9.2f}")


if __name__ == "__main__":
    main()
