"""Training throughput of a mixture-of-experts model (moe-tiny) through llmtrain's trainer against a plain PyTorch
loop of the same model, batches and optimizer, on CPU.

One process, fp32, the same OMP_NUM_THREADS on both sides (--threads, default 2), each run in a fresh interpreter
(this script re-runs itself with --side):

- llmtrain: the run directory prepared as `llmtrain launch` prepares it (config, data, resume check), then
  `llmtrain.worker` runs in that interpreter as rank 0 of 1 (no torchrun: its start-up is not what is measured).
  RUN_DIR/metrics.jsonl gives every step's step_time_s and elapsed_s (train.log_interval=1).
- plain: scripts/plain_loop.py's `train` on the same composed config: `llmtrain.model.build_model` materialized
  from meta and initialized by `init_parameters`, the same batches (`SampleStream`), fp32 cross entropy, clipping,
  the warmup + cosine learning rate and torch.optim.AdamW with foreach=False (what optim.fused=auto is on CPU).
  The MoE block adds its auxiliary losses to the gradient itself (its aux_loss_scale stays 1.0: no accumulation,
  no loss scaling), so both sides train the same model on the same samples: their losses must agree (within
  --loss-tolerance, relative), or the comparison is not like for like and the script says so and exits 1.

A pair is one run of each side, the order alternating between pairs. Per run, over the steps after --skip:
  step: tokens per step / median step time (llmtrain: step_time_s, the train step without the metrics row; plain:
        the whole step, its loss read back included, as llmtrain reads its loss every step);
  loop: llmtrain only: tokens per step / median time between the ends of consecutive steps, the per-step metrics
        row (written and fsynced, with the expert counts) included;
  best: tokens per step / the fastest step time (the least disturbed step: the steadiest figure when other jobs
        share the cores, which on 2 cores can slow a whole run of 2 OpenMP threads many times over).
The result is the median over pairs of each figure and of each pair's llmtrain / plain (target >= 0.95x; a pair's
two runs are neighbours in time, so their ratio is the steadier figure on a shared machine). Exit 0 when the median
step ratio meets --target, 1 otherwise.

  python scripts/bench_moe_cpu.py [--pairs 3] [--steps 30] [--skip 10] [--batch 8] [--threads 2] [OVERRIDES...]
  OVERRIDES (llmtrain's key=value, after the defaults model=moe-tiny and data=stdlib) change the model, e.g.
  model.moe.grouped_mm=on (the experts as torch._grouped_mm, which torch 2.13 also runs on the CPU), or
  model=llama-tiny 'model.moe={n_experts:8,top_k:2,expert_ffn_dim:64}' (a Llama with experts)
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "scripts")]  # this checkout's llmtrain, and plain_loop


def overrides(a, run_dir: str | None = None) -> list[str]:
    model = [] if any(o.startswith("model=") for o in a.overrides) else ["model=moe-tiny"]
    return [*([f"run.dir={run_dir}"] if run_dir else []), *model, "data=stdlib", *a.overrides,
            f"train.micro_batch_size={a.batch}", f"train.global_batch_size={a.batch}", f"train.max_steps={a.steps}",
            "train.log_interval=1", "train.eval_interval=0", "checkpoint.at_end=false", "checkpoint.resume=none",
            "cluster.nproc_per_node=1", "device=cpu", "precision=fp32", f"launch.omp_num_threads={a.threads}"]


# ---------------------------------------------------------------------------------------------------- one side

def side_plain(a, result: Path) -> None:
    from plain_loop import train

    from llmtrain.config import compose_config
    from llmtrain.launch.config_probes import validate_here
    from llmtrain.launch.run import prepare_data

    cfg = compose_config(overrides(a))
    validate_here(cfg)
    prepare_data(cfg)
    out = train(cfg, a.steps, fused=False)
    result.write_text(json.dumps({"step_times": out["step_times"], "losses": out["losses"], "seq": cfg.model.seq_len,
                                  "model": cfg.model.name, "moe": cfg.model.get("moe") is not None}))


def side_llmtrain(a, run_dir: str) -> int:
    from rich.console import Console

    from llmtrain import worker
    from llmtrain.launch.config_probes import compose_here, validate_here
    from llmtrain.launch.run import check_resume, prepare_data, prepare_run_dir

    origins: dict[str, str] = {}
    cfg = compose_here(overrides(a, run_dir), origins=origins)
    validate_here(cfg)
    prepare_data(cfg)
    check_resume(cfg, Console(quiet=True), origins)
    prepare_run_dir(cfg)
    with socket.socket() as s:  # the process group's rendezvous (gloo, one rank)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    return worker.main([run_dir])  # its output goes to RUN_DIR/logs/rank0.log


# ---------------------------------------------------------------------------------------------------- the pairs

def rerun(a, *extra: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
    argv = [sys.executable, __file__, *extra, "--steps", str(a.steps), "--batch", str(a.batch), "--threads",
            str(a.threads), *a.overrides]
    return subprocess.run(argv, env=env, capture_output=True, text=True)


def run_plain(a, tmp: str) -> dict:
    result = Path(tmp) / "plain.json"
    proc = rerun(a, "--side", "plain", "--out", str(result))
    if proc.returncode:
        sys.exit(f"the plain loop failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return json.loads(result.read_text())


def run_llmtrain(a, tmp: str) -> dict:
    run_dir = Path(tmp) / "run"
    proc = rerun(a, "--side", "llmtrain", "--out", str(run_dir))
    status = run_dir / "logs" / "rank0.status"
    if proc.returncode or json.loads(status.read_text()).get("status") != "ok":
        log = (run_dir / "logs" / "rank0.log").read_text(errors="replace")[-3000:]
        sys.exit(f"llmtrain failed ({proc.returncode}):\n{proc.stderr[-3000:]}\n{log}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    rows = sorted((r for r in rows if "step_time_s" in r), key=lambda r: r["step"])
    assert [r["step"] for r in rows] == list(range(1, a.steps + 1)), "need one row per step (log_interval=1)"
    return {"step_times": [r["step_time_s"] for r in rows], "ends": [r["elapsed_s"] for r in rows],
            "losses": [r["loss"] for r in rows], "moe": "expert_tokens" in rows[-1]}


def tokens_per_s(a, seq: int, times: list[float]) -> float:
    return a.batch * seq / statistics.median(times[a.skip:])


def max_relative_difference(x: list[float], y: list[float]) -> float:
    return max(abs(p - q) / abs(p) for p, q in zip(x, y, strict=True))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--skip", type=int, default=10, help="warm-up steps left out of the medians")
    p.add_argument("--batch", type=int, default=8, help="micro = global batch (no accumulation)")
    p.add_argument("--threads", type=int, default=2, help="OMP_NUM_THREADS of both sides")
    p.add_argument("--target", type=float, default=0.95, help="llmtrain / plain by median step time")
    p.add_argument("--loss-tolerance", type=float, default=1e-5, help="relative; the two sides' losses per step")
    p.add_argument("--side", choices=["plain", "llmtrain"], help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("overrides", nargs="*", help="llmtrain key=value overrides")
    a = p.parse_args()
    if not 1 <= a.skip < a.steps:
        p.error("need 1 <= --skip < --steps")
    if a.side == "plain":
        return side_plain(a, Path(a.out)) or 0
    if a.side == "llmtrain":
        return side_llmtrain(a, a.out)

    pairs = []
    for i in range(a.pairs):
        order = ["plain", "llmtrain"] if i % 2 == 0 else ["llmtrain", "plain"]
        got = {}
        for side in order:
            with tempfile.TemporaryDirectory(prefix="bench-moe-") as tmp:
                got[side] = (run_plain if side == "plain" else run_llmtrain)(a, tmp)
        plain, ours = got["plain"], got["llmtrain"]
        if i == 0:
            print(f"{plain['model']}{' (MoE)' if plain['moe'] else ' (dense)'}: batch {a.batch} x seq {plain['seq']} "
                  f"= {a.batch * plain['seq']} tokens/step, fp32 CPU, OMP_NUM_THREADS={a.threads}; steps "
                  f"{a.skip + 1}..{a.steps} of {a.steps}; {a.pairs} pairs", flush=True)
        diff = max_relative_difference(plain["losses"], ours["losses"])
        if diff > a.loss_tolerance:
            print(f"the two sides' losses differ by {diff:.1e} (relative; tolerance {a.loss_tolerance:g}): not the "
                  f"same training, so no comparison", flush=True)
            return 1
        seq = plain["seq"]
        loop = [ours["ends"][k] - ours["ends"][k - 1] for k in range(1, a.steps)]
        figures = {"plain": tokens_per_s(a, seq, plain["step_times"]),
                   "llmtrain": tokens_per_s(a, seq, ours["step_times"]),
                   "loop": a.batch * seq / statistics.median(loop[a.skip - 1:]),
                   "best_ratio": min(plain["step_times"][a.skip:]) / min(ours["step_times"][a.skip:])}
        figures["ratio"] = figures["llmtrain"] / figures["plain"]
        figures["loop_ratio"] = figures["loop"] / figures["plain"]
        pairs.append(figures)
        print(f"  pair {i + 1} ({order[0]} first): plain {figures['plain']:>8,.0f}  llmtrain {figures['llmtrain']:>8,.0f}"
              f" tok/s = {figures['ratio']:.3f}x;  llmtrain loop {figures['loop']:>8,.0f} tok/s = "
              f"{figures['loop_ratio']:.3f}x;  fastest steps {figures['best_ratio']:.3f}x;  losses within {diff:.1e}",
              flush=True)
    med = {k: statistics.median(f[k] for f in pairs) for k in pairs[0]}
    print(f"\nmedians of {a.pairs} pairs: plain {med['plain']:,.0f}, llmtrain {med['llmtrain']:,.0f} tok/s; llmtrain / "
          f"plain {med['ratio']:.3f}x by step (target >= {a.target:g}: {'met' if med['ratio'] >= a.target else 'missed'})"
          f"; llmtrain's loop with a metrics row every step {med['loop']:,.0f} tok/s, {med['loop_ratio']:.3f}x; fastest "
          f"steps {med['best_ratio']:.3f}x")
    return 0 if med["ratio"] >= a.target else 1


if __name__ == "__main__":
    sys.exit(main())
