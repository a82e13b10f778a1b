"""The parts of scripts/gpu_check.sh, one per call, and the summary table they add up to.

  python scripts/gpu_check_parts.py PART --out DIR [--device cuda|cpu] [--log FILE] [--limit SECONDS]
  python scripts/gpu_check_parts.py summary --out DIR
  python scripts/gpu_check_parts.py plan [--long [1|2]] [--parts LIST] [--deadline S] [--device cuda|cpu] [--shell]

A part runs its llmtrain launches (and scripts) as subprocesses, reads their figures from each run's
metrics.jsonl and logs/rank0.status, and writes DIR/results/PART.json: {part, title, status (PASS, FAIL or
SKIP), detail, log}. At --limit the part stops at once with every process it started, without a checkpoint
(gpu_check_stop.py), and exits 124; a part that dies or times out writes nothing, and gpu_check.sh records it as
FAIL (TIMEOUT when the check's deadline stopped it).
`--device cpu` is the dry mode: the same logic with tiny models and a few steps, so the script itself is tested
without a GPU (its figures mean nothing). `plan` prints what gpu_check.sh runs (gpu_check_plan.py): each part with
its time limit, measured or estimated, and the check's deadline.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # this checkout's llmtrain
sys.path.insert(0, str(REPO / "scripts"))  # the check's other modules, also when this one is loaded by path

from gpu_check_plan import plan_main, where_run  # noqa: E402
from gpu_check_stop import arm, halt_if_stopping, stop_on_signals  # noqa: E402

TITLES = {
    "smoke": "1 smoke run (gpt-tiny)",
    "throughput": "2 tokens/s and MFU: defaults, fastest settings",
    "plain": "3 llmtrain / plain PyTorch loop",
    "fp16": "4 fp16 with loss scaling",
    "memory": "5 peak memory / `llmtrain plan`",
    "resume": "6 checkpoint save + resume = uninterrupted",
    "async_save": "7 async checkpoint save vs sync",
    "apex": "8 apex FusedAdam (optim.fused=apex)",
    "fp8": "9 fp8 (torchao float8) vs bf16, compiled",
    "llama": "10 llama3-1b bf16 tokens/s and MFU, fp8 recipes vs bf16",
    "tune": "11 llmtrain tune (top 3): the winner's MFU vs the defaults'",
    "moe": "12 MoE (OLMoE shape, 4 layers) bf16 tokens/s and MFU, grouped vs loop",
    "long": "13 llama3-1b at seq 8192, the plan's layout: tokens/s, MFU, peak / plan",
    "step": "14 llama3-1b step: train.loss and train.attention variants, tokens/s, MFU, peak",
}
PEAK_TOLERANCE = 0.10  # |predicted / measured - 1| for the memory part
LOSS_TOLERANCE = 1e-3  # relative loss difference of runs that should agree (CUDA kernels may use atomics)
MIN_PLAIN_RATIO = 0.95  # llmtrain tokens/s / plain loop tokens/s on a GPU


class Sizes:
    """Models and step counts: the real ones on a GPU, tiny ones for the CPU dry mode."""

    def __init__(self, device: str):
        self.device = device
        gpu = device == "cuda"
        # gpt-1.3b in the GPT-3 paper's shape (24 heads x 128), the shape `llmtrain plan` was checked against; on
        # CPU fp32, the precision the CPU memory model is checked in.
        self.big = (["model=gpt-1.3b", "model.n_heads=24", "model.head_dim=128", "precision=bf16"] if gpu else
                    ["model=gpt-tiny", "model.n_layers=2", "model.d_model=128", "model.n_heads=2",
                     "model.seq_len=128", "precision=fp32"])
        self.micro, self.fast_micro = (4, 8) if gpu else (2, 4)
        self.mid = ["model=gpt-125m", "model.seq_len=1024"] if gpu else \
            ["model=gpt-tiny", "model.n_layers=2", "model.seq_len=64"]
        self.tiny = ["model=gpt-tiny"] if gpu else ["model=gpt-tiny", "model.n_layers=2", "model.seq_len=32"]
        # On CPU the peak's profiler (steps 1-2) leaves the next few steps slow: skip them too.
        self.steps, self.skip = (15, 5) if gpu else (10, 7)
        self.smoke_steps = 20 if gpu else 6  # enough for the loss to fall; the CPU's dry mode only needs the logic
        # Fastest settings beyond the layout: compile costs ~50 s of start-up, too slow for the CPU dry mode.
        self.fast_extra = ["optim.fused=torch", "train.compile=true"] if gpu else ["optim.fused=torch"]
        # On CPU the peak needs the profiler (profile.memory); CUDA always records max_memory_allocated.
        self.peak = [] if gpu else ["profile.memory=true"]

    def common(self) -> list[str]:
        return [f"device={self.device}", "cluster.nproc_per_node=1", "data=synthetic", "train.log_interval=1",
                "train.eval_interval=0", "checkpoint.resume=none", "checkpoint.at_end=false", "hardware=auto"]

    def batch(self, micro: int) -> list[str]:
        return [f"train.micro_batch_size={micro}", f"train.global_batch_size={2 * micro}"]


class Part:
    def __init__(self, out: Path, sizes: Sizes):
        self.out = out
        self.sizes = sizes
        self.runs = out / "runs"

    def launch(self, name: str, overrides: list[str], fresh: bool = True) -> Path:
        """`python3 -m llmtrain launch` into runs/NAME (output into this part's log); raises if it fails."""
        run_dir = self.runs / name
        if fresh and run_dir.exists():
            import shutil

            shutil.rmtree(run_dir)
        argv = [sys.executable, "-m", "llmtrain", "launch", f"run.dir={run_dir}", *self.sizes.common(), *overrides]
        code = self.run(argv).returncode
        if code:
            raise RuntimeError(f"llmtrain launch {name} failed (exit {code}); see {run_dir}/logs")
        return run_dir

    def run(self, argv: list[str], capture: bool = False, env: dict | None = None) -> subprocess.CompletedProcess:
        """A command of this part (its output into the part's log, or captured as text), timed in the log."""
        halt_if_stopping()
        print("$ " + " ".join(argv), flush=True)
        start = time.perf_counter()
        proc = subprocess.run(argv, cwd=REPO, env=env, stdout=subprocess.PIPE if capture else sys.stdout,
                              stderr=sys.stderr, text=True)
        halt_if_stopping()  # it was killed by the part's stop: the exit comes
        print(f"{proc.stdout if capture else ''}({time.perf_counter() - start:.0f} s, exit {proc.returncode})",
              flush=True)
        return proc

    def reuse_or_launch(self, name: str, overrides: list[str], steps: int) -> Path:
        """A run another part already made with these settings (when it finished), else a new one."""
        run_dir = self.runs / name
        done = [r for r in train_rows(run_dir) if "tokens_per_s" in r]
        if len(done) >= steps and peak_bytes(run_dir) is not None:
            print(f"reusing {run_dir}", flush=True)
            return run_dir
        return self.launch(name, overrides)

    def defaults_run(self) -> Path:
        s = self.sizes
        return self.reuse_or_launch("big-defaults", [*s.big, *s.batch(s.micro), f"train.max_steps={s.steps}",
                                                     *s.peak], s.steps)


def train_rows(run_dir: Path) -> list[dict]:
    from llmtrain.rundir.metrics_file import read_metrics

    return [r for r in read_metrics(str(run_dir / "metrics.jsonl")) if "loss" in r]


def peak_bytes(run_dir: Path) -> int | None:
    """The trainer's peak of live tensor bytes over steps 1-2 (logs/rank0.status)."""
    try:
        status = json.loads((run_dir / "logs" / "rank0.status").read_text())
    except (OSError, ValueError):
        return None
    return (status.get("state_bytes") or {}).get("peak")


def steady(run_dir: Path, skip: int) -> dict:
    """Medians over the steps after `skip`: tokens/s, MFU (the trainer's, against its hardware's dense peak; None
    when a row has none to show: no known peak, as on a CPU), that peak (TFLOPS) and the compute dtype."""
    from llmtrain.rundir.mfu_field import PEAK_KEY, shown_mfu

    rows = [r for r in train_rows(run_dir) if "tokens_per_s" in r and r["step"] > skip]
    if not rows:
        raise RuntimeError(f"{run_dir}/metrics.jsonl has no steps after {skip}")
    mfus = [shown_mfu(r) for r in rows]
    shown = None not in mfus
    return {"tokens_per_s": statistics.median(r["tokens_per_s"] for r in rows),
            "mfu": statistics.median(mfus) if shown else None,
            "peak_tflops": rows[-1][PEAK_KEY] if shown else None, "dtype": compute_dtype(run_dir),
            "step_time_s": statistics.median(r["step_time_s"] for r in rows)}


SHORT_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


def compute_dtype(run_dir: Path) -> str | None:
    """The run's precision.compute_dtype (its config.yaml), as MFU's peak names it: bf16, fp16, fp32."""
    import yaml

    try:
        dtype = yaml.safe_load((run_dir / "config.yaml").read_text())["precision"]["compute_dtype"]
    except (OSError, ValueError, KeyError, TypeError, yaml.YAMLError):
        return None
    return SHORT_DTYPES.get(dtype, dtype)


def mfu_text(figures: dict) -> str:
    """A steady MFU as the figures show it: only against a known peak, which it names (`MFU 46.2% of 989 TFLOPS
    bf16`)."""
    if figures["mfu"] is None:
        return "MFU not shown (no known peak)"
    dtype = f" {figures['dtype']}" if figures.get("dtype") else ""
    return f"MFU {figures['mfu']:.1%} of {figures['peak_tflops']:,.0f} TFLOPS{dtype}"


def size(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def planned_peak(overrides: list[str]) -> float:
    """`llmtrain plan`'s peak per rank for these overrides (the same functions the CLI runs)."""
    from llmtrain.config import compose_config
    from llmtrain.launch.config_probes import validate_here
    from llmtrain.plan.cli import plan_for

    cfg = compose_config(overrides)
    validate_here(cfg)
    return plan_for(cfg).peak_bytes_per_rank


def device_memory_gib(device: str) -> float:
    if device == "cuda":
        import torch

        return torch.cuda.get_device_properties(0).total_memory / 2**30
    import psutil

    return psutil.virtual_memory().total / 2**30


def suggest_plans(overrides: list[str], gib: float) -> list[dict]:
    """The single-device plans `llmtrain plan --suggest 1 GIB --json` ranks, fastest first ([]: none fits)."""
    argv = [sys.executable, "-m", "llmtrain", "plan", *overrides, "--suggest", "1", str(math.floor(gib)), "--json"]
    halt_if_stopping()
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True)
    print("$ " + " ".join(argv) + f"\n(exit {proc.returncode})", flush=True)
    try:
        return json.loads(proc.stdout) or []
    except ValueError:
        return []


def suggested(overrides: list[str], gib: float) -> list[str] | None:
    """The fastest single-device layout `llmtrain plan --suggest 1 GIB` ranks first, as overrides (None: none
    fits). --suggest varies tp, pp, zero and recompute; on one device that leaves the recompute mode."""
    plans = suggest_plans(overrides, gib)
    if not plans:
        return None
    d = plans[0]["dims"]
    return [f"recompute={d['recompute']}", f"parallel.zero={d['zero']}"]


# ---- the parts -----------------------------------------------------------------------------------------------------
def part_smoke(p: Part) -> tuple[str, str]:
    steps = p.sizes.smoke_steps
    run = p.launch("smoke", [*p.sizes.tiny, f"train.max_steps={steps}", "train.warmup_steps=2"])
    losses = [r["loss"] for r in train_rows(run)]
    ok = len(losses) == steps and all(math.isfinite(v) for v in losses) and losses[-1] < losses[0]
    return ("PASS" if ok else "FAIL"), f"{steps} steps, loss {losses[0]:.3f} -> {losses[-1]:.3f}"


def part_throughput(p: Part) -> tuple[str, str]:
    s = p.sizes
    base = steady(p.defaults_run(), s.skip)
    fast_batch = [*s.big, *s.batch(s.fast_micro)]
    layout = suggested(fast_batch + s.common(), device_memory_gib(s.device)) or []
    settings = [*layout, *s.fast_extra]
    batch = fast_batch if layout else [*s.big, *s.batch(s.micro)]  # the larger micro-batch only if it fits
    fast = steady(p.launch("big-fastest", [*batch, *settings, f"train.max_steps={s.steps}"]), s.skip)
    micro = s.fast_micro if layout else s.micro
    return "PASS", (f"defaults (micro {s.micro}): {base['tokens_per_s']:,.0f} tok/s, {mfu_text(base)}; "
                    f"fastest (micro {micro}, {' '.join(settings)}): {fast['tokens_per_s']:,.0f} tok/s, "
                    f"{mfu_text(fast)}")


def max_relative_difference(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) / abs(x) for x, y in zip(a, b, strict=True))


def part_plain(p: Part) -> tuple[str, str]:
    s = p.sizes
    run = p.defaults_run()
    ours = steady(run, s.skip)
    result = p.out / "plain_loop.json"
    # optim.fused=auto, llmtrain's default, is torch's fused AdamW on CUDA and the per-parameter loop on CPU.
    kernel = [] if s.device == "cuda" else ["--no-fused"]
    argv = [sys.executable, str(REPO / "scripts" / "plain_loop.py"), "--steps", str(s.steps), "--skip", str(s.skip),
            "--out", str(result), *kernel, *s.big, *s.batch(s.micro), *s.common()]
    if p.run(argv).returncode:
        raise RuntimeError("scripts/plain_loop.py failed")
    plain = json.loads(result.read_text())
    ratio = ours["tokens_per_s"] / plain["tokens_per_s"]
    floor = MIN_PLAIN_RATIO if s.device == "cuda" else 0.0  # CPU dry mode: the logic, not the figure
    # Same model, initialization and batches: the losses agree, or the comparison is not like for like.
    diff = max_relative_difference(plain["losses"], [r["loss"] for r in train_rows(run)][:s.steps])
    ok = ratio >= floor and diff <= LOSS_TOLERANCE
    return ("PASS" if ok else "FAIL"), (
        f"llmtrain {ours['tokens_per_s']:,.0f} / plain {plain['tokens_per_s']:,.0f} tok/s = {ratio:.3f}x "
        f"(micro {s.micro}; pass >= {floor:g}); losses of steps 1-{s.steps} within {diff:.1e} (pass <= "
        f"{LOSS_TOLERANCE:g})")


def part_fp16(p: Part) -> tuple[str, str]:
    s = p.sizes
    rows = train_rows(p.launch("fp16", [*s.mid, "precision=fp16", *s.batch(s.micro), "train.max_steps=10"]))
    last = rows[-1] if rows else {}
    finite = bool(rows) and all(math.isfinite(r["loss"]) for r in rows) and rows[-1]["step"] == 10
    scaled = "loss_scale" in last
    return ("PASS" if finite and scaled else "FAIL"), (
        f"10 steps, last loss {last.get('loss', float('nan')):.4f}, loss scale {last.get('loss_scale')}, "
        f"skipped steps {last.get('skipped_steps')}")


def part_memory(p: Part) -> tuple[str, str]:
    s = p.sizes
    checks = {"none": p.defaults_run(),
              "full": p.reuse_or_launch("big-recompute-full", [*s.big, *s.batch(s.micro), "recompute=full",
                                                               "train.max_steps=3", *s.peak], 3)}
    details, ok = [], True
    for mode, run in checks.items():
        measured = peak_bytes(run)
        predicted = planned_peak([*s.big, *s.batch(s.micro), f"recompute={mode}", *s.common()])
        if measured is None:
            details.append(f"recompute={mode}: no measured peak")
            ok = False
            continue
        ratio = predicted / measured
        ok &= abs(ratio - 1) <= PEAK_TOLERANCE
        details.append(f"recompute={mode}: {size(measured)} measured, plan {size(predicted)} ({ratio:.3f}x)")
    return ("PASS" if ok else "FAIL"), "; ".join(details) + f" (pass within {PEAK_TOLERANCE:.0%})"


def part_resume(p: Part) -> tuple[str, str]:
    s = p.sizes
    run = [*s.mid, *s.batch(s.micro), "train.max_steps=6", "train.warmup_steps=2", "checkpoint.at_end=true"]
    whole = train_rows(p.launch("resume-whole", run))
    p.launch("resume-split", [*run, "train.stop_at_step=3"])  # checkpoints at step 3 and stops
    split = train_rows(p.launch("resume-split", [*run, "checkpoint.resume=auto"], fresh=False))
    a = {r["step"]: r["loss"] for r in whole}
    b = {r["step"]: r["loss"] for r in split}
    if sorted(a) != list(range(1, 7)) or sorted(b) != list(range(1, 7)):
        return "FAIL", f"steps logged: uninterrupted {sorted(a)}, saved at 3 and resumed {sorted(b)}"
    diff = max_relative_difference([a[k] for k in sorted(a)], [b[k] for k in sorted(a)])
    how = "bitwise equal" if all(a[k] == b[k] for k in a) else f"max relative difference {diff:.1e}"
    return ("PASS" if diff <= LOSS_TOLERANCE else "FAIL"), (
        f"saved at step 3, resumed to 6: losses of steps 1-6 {how} to the uninterrupted run "
        f"(pass <= {LOSS_TOLERANCE:g})")


def part_async_save(p: Part) -> tuple[str, str]:
    s = p.sizes
    result = p.out / "async_save.json"
    model = ["--model", "gpt-125m", "--seq", "1024"] if s.device == "cuda" else \
        ["--model", "gpt-tiny", "--seq", "64", "--warmup", "1", "--baseline", "1"]
    argv = [sys.executable, str(REPO / "scripts" / "bench_async_save.py"), *model, "--repeats", "2",
            "--device", s.device, "--workdir", str(p.out), "--json", str(result)]
    p.run(argv)  # exit 1: target missed, still measured
    r = json.loads(result.read_text())
    target = "met" if r["blocked_fraction"] <= 0.10 else "missed"
    return "PASS", (f"sync save {r['sync_s']:.2f} s; async blocks {r['blocked_s']:.2f} s = "
                    f"{r['blocked_fraction']:.1%} of it (target <= 10%: {target}); steps during the background "
                    f"write {r['step_during_write_s']:.2f} s vs {r['step_s']:.2f} s")


def part_apex(p: Part) -> tuple[str, str]:
    from llmtrain.launch.config_probes import apex_missing

    s = p.sizes
    missing = apex_missing() if s.device == "cuda" else "apex needs CUDA"
    if missing:
        return "SKIP", missing.split(":")[0]
    rows = train_rows(p.launch("apex", [*s.mid, "precision=bf16", "optim.fused=apex", *s.batch(s.micro),
                                        "train.max_steps=10"]))
    finite = len(rows) == 10 and all(math.isfinite(r["loss"]) for r in rows)
    tps = statistics.median(r["tokens_per_s"] for r in rows[3:]) if len(rows) > 3 else float("nan")
    return ("PASS" if finite else "FAIL"), f"10 steps, last loss {rows[-1]['loss']:.4f}, {tps:,.0f} tok/s"


def in_own_module(part: str):
    """A part kept in scripts/gpu_check_PART.py, imported when it runs (that module imports this one)."""
    def run(p: Part) -> tuple[str, str]:
        import importlib

        return getattr(importlib.import_module(f"gpu_check_{part}"), f"part_{part}")(p)
    return run


part_fp8, part_llama, part_tune, part_moe, part_long, part_step = (
    in_own_module(name) for name in ("fp8", "llama", "tune", "moe", "long", "step"))


PARTS = {"smoke": part_smoke, "throughput": part_throughput, "plain": part_plain, "fp16": part_fp16,
         "memory": part_memory, "resume": part_resume, "async_save": part_async_save, "apex": part_apex,
         "fp8": part_fp8, "llama": part_llama, "tune": part_tune, "moe": part_moe,
         "long": part_long, "step": part_step}


def record(out: Path, part: str, status: str, detail: str, log: str) -> None:
    halt_if_stopping()  # a part stopped at its limit has no row: gpu_check.sh writes it
    (out / "results").mkdir(parents=True, exist_ok=True)
    row = {"part": part, "title": TITLES[part], "status": status, "detail": detail, "log": log}
    tmp = out / "results" / f".{part}.json"
    tmp.write_text(json.dumps(row) + "\n")
    tmp.replace(out / "results" / f"{part}.json")  # whole or not at all, also when the limit falls meanwhile


def summary(out: Path) -> str:
    """The table of every part's row, as markdown. gpu_check.sh writes a row for each part it ran or skipped, so a
    part without a row was not asked for."""
    lines = ["| part | status | figures | log |", "|---|---|---|---|"]
    for part, title in TITLES.items():
        path = out / "results" / f"{part}.json"
        row = json.loads(path.read_text()) if path.exists() else \
            {"status": "NOT RUN", "detail": f"not asked for ({where_run(part)} runs it)", "log": ""}
        lines.append(f"| {title} | {row['status']} | {row['detail']} | {row['log']} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    if sys.argv[1:2] == ["plan"]:
        return plan_main(sys.argv[2:])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("part", choices=[*PARTS, "summary"])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--log", default="", help="this part's log, named in its row")
    ap.add_argument("--limit", type=float, default=None, help="seconds: then stop at once, exit 124 (no row)")
    a = ap.parse_args()
    if a.part == "summary":
        text = summary(a.out)
        (a.out / "summary.md").write_text(text)
        print(text, end="")
        return 0
    stop_on_signals(a.part)
    if a.limit is not None:
        arm(a.limit, a.part)
    try:
        status, detail = PARTS[a.part](Part(a.out, Sizes(a.device)))
    except Exception as e:  # the row says what failed; the traceback is in the log
        import traceback

        traceback.print_exc()
        status, detail = "FAIL", f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    record(a.out, a.part, status, detail, a.log)
    print(f"{a.part}: {status}: {detail}", flush=True)
    return 0 if status != "FAIL" else 1


if __name__ == "__main__":
    sys.exit(main())
