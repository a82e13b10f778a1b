"""What straggler detection costs: tokens/s of the same 2-rank CPU run with detection on (launch.straggler_factor
default) and off (launch.straggler_factor=0), alternating on/off so drifting machine load hits both alike.

Each run logs every step (train.log_interval=1), the worst case: one all_gather of a float per step. A run's
figure is the median tokens/s of its rows after the first 5 steps; reported are the median over the repeats for
each setting, their difference, and the noise: the spread (max - min) of the runs of each setting.

  python scripts/bench_straggler_overhead.py [--repeats 3] [--steps 40] [--nproc 2] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OVERRIDES = ["model.d_model=64", "model.seq_len=64", "train.log_interval=1", "train.eval_interval=0",
             "train.warmup_steps=2", "train.global_batch_size=8", "train.micro_batch_size=2",
             "checkpoint.at_end=false", "checkpoint.interval_minutes=0"]


def one_run(run_dir: Path, steps: int, nproc: int, detection: bool) -> float:
    """Median tokens/s after the first 5 steps of one launch."""
    factor = [] if detection else ["launch.straggler_factor=0"]
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    result = subprocess.run([sys.executable, "-m", "llmtrain", "launch", f"run.dir={run_dir}", *OVERRIDES,
                             f"train.max_steps={steps}", f"cluster.nproc_per_node={nproc}", *factor],
                            capture_output=True, text=True, env=env, timeout=1200)
    if result.returncode != 0:
        sys.exit(f"launch failed:\n{result.stdout[-2000:]}{result.stderr[-2000:]}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return statistics.median(r["tokens_per_s"] for r in rows if "loss" in r and r["step"] > 5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--workdir", default=None)
    a = parser.parse_args()
    work = Path(a.workdir or tempfile.mkdtemp(prefix="bench-straggler-"))
    runs: dict[bool, list[float]] = {True: [], False: []}
    for i in range(a.repeats):
        for detection in (True, False):
            tps = one_run(work / f"{'on' if detection else 'off'}{i}", a.steps, a.nproc, detection)
            runs[detection].append(tps)
            print(f"repeat {i + 1}: detection {'on ' if detection else 'off'} {tps:,.0f} tok/s", flush=True)
    on, off = statistics.median(runs[True]), statistics.median(runs[False])
    spread = {k: max(v) - min(v) for k, v in runs.items()}
    print(f"detection on:  {on:,.0f} tok/s (median of {a.repeats}; spread {spread[True]:,.0f})")
    print(f"detection off: {off:,.0f} tok/s (median of {a.repeats}; spread {spread[False]:,.0f})")
    print(f"difference: {(on - off) / off:+.1%} (noise: spread / median {spread[True] / on:.1%} on, "
          f"{spread[False] / off:.1%} off)")


if __name__ == "__main__":
    main()
