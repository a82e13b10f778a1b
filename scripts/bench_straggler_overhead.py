"""What straggler detection costs: tokens/s of the same 2-rank CPU run with detection on (launch.straggler_factor
default) and off (launch.straggler_factor=0), alternating on/off so drifting machine load hits both alike.

Each run logs every step (train.log_interval=1), the worst case: one all_gather of a float per step. A run's
figure is the median tokens/s of its rows after the first 5 steps; reported are the median over the repeats for
each setting, their difference, and the noise: the spread (max - min) of the runs of each setting.
Then the cost itself, which the launches' noise can hide: the median time of one interval's detection (the clock
read, the all_gather, the decision) over --calls calls in a group of --nproc gloo processes, and what timing a
collective's wait adds to each collective call (llmtrain.train.collective_wait): a timed no-op against the bare one.

  python scripts/bench_straggler_overhead.py [--repeats 3] [--steps 40] [--nproc 2] [--calls 500] [--workdir DIR]
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
TOKENS_PER_STEP = 8 * 64  # train.global_batch_size x model.seq_len below
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


def _time_interval_done(rank: int, world: int, port: int, calls: int, out) -> None:
    import time as clock

    import torch
    import torch.distributed as dist
    from omegaconf import OmegaConf

    sys.path.insert(0, str(REPO))
    from llmtrain.train.straggler_watch import ComputeClock, StragglerWatch

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    compute = ComputeClock(torch.device("cpu"))
    watch = StragglerWatch(OmegaConf.create({"straggler_factor": 1.2, "straggler_intervals": 3}), compute,
                           lambda *a, **k: None, torch.device("cpu"))
    seconds = []
    for _ in range(calls):
        compute.start()
        compute.stop()
        dist.barrier()
        began = clock.perf_counter()
        watch.interval_done()
        seconds.append(clock.perf_counter() - began)
    if rank == 0:
        out.put(statistics.median(seconds))
    dist.destroy_process_group()


def wait_timing_cost(calls: int) -> float:
    """Seconds that timing a collective's wait adds to one call: a timed no-op's median less the bare one's."""
    import time as clock

    sys.path.insert(0, str(REPO))
    from llmtrain.train.collective_wait import timed

    def noop():
        return None

    def median_call(fn) -> float:
        seconds = []
        for _ in range(calls):
            began = clock.perf_counter()
            fn()
            seconds.append(clock.perf_counter() - began)
        return statistics.median(seconds)

    return median_call(timed(noop)) - median_call(noop)


def interval_cost(nproc: int, calls: int) -> float:
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_time_interval_done, args=(r, nproc, port, calls, out)) for r in range(nproc)]
    for p in procs:
        p.start()
    cost = out.get(timeout=600)
    for p in procs:
        p.join()
    return cost


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="launch pairs; 0: only the direct measurement")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--workdir", default=None)
    a = parser.parse_args()
    work = Path(a.workdir or tempfile.mkdtemp(prefix="bench-straggler-"))
    runs: dict[bool, list[float]] = {True: [], False: []}
    for i in range(a.repeats):
        for detection in (True, False):
            tps = one_run(work / f"{'on' if detection else 'off'}{i}", a.steps, a.nproc, detection)
            runs[detection].append(tps)
            print(f"repeat {i + 1}: detection {'on ' if detection else 'off'} {tps:,.0f} tok/s", flush=True)
    off = None
    if a.repeats:
        on, off = statistics.median(runs[True]), statistics.median(runs[False])
        spread = {k: max(v) - min(v) for k, v in runs.items()}
        print(f"detection on:  {on:,.0f} tok/s (median of {a.repeats}; spread {spread[True]:,.0f})")
        print(f"detection off: {off:,.0f} tok/s (median of {a.repeats}; spread {spread[False]:,.0f})")
        print(f"difference: {(on - off) / off:+.1%} (noise: spread / median {spread[True] / on:.1%} on, "
              f"{spread[False] / off:.1%} off)")
    cost = interval_cost(a.nproc, a.calls)
    line = f"one interval's detection: {cost * 1e3:.3f} ms (median of {a.calls} calls, {a.nproc} gloo ranks)"
    if off:
        step_s = TOKENS_PER_STEP / off
        line += f", {cost / step_s:.2%} of a {step_s * 1e3:.0f} ms step of the runs above"
    print(line)
    wait = wait_timing_cost(a.calls * 20)
    print(f"timing a collective's wait: {wait * 1e6:.2f} us per collective call (median of {a.calls * 20} calls)")


if __name__ == "__main__":
    main()
