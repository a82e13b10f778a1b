"""gpu_check.sh's step part: what one GPU step leaves on the table in its loss and its attention kernel.

llama3-1b at a 2048-token context, bf16, compiled, the `llama` part's micro-batch and global batch, one launch per
variant of STEP_STEPS steps: train.loss=full, chunked and liger (liger only where liger_kernel is importable), then
train.attention=cudnn and flash (with train.loss=auto). Each variant's tokens/s, MFU and peak memory (the trainer's
peak of steps 1-2); the row names the fastest variant and its gain over train.loss=full. A variant whose launch
fails is reported in the row: an attention kernel may have no kernel for the shape on that GPU, which is a finding,
not a failure of the part; a loss variant that fails (or any non-finite loss) fails the part. Each finished run's
figures are recorded as soon as it ends, so a part stopped at its limit still shows them.

On CPU (the dry mode) a two-layer llama-tiny in fp32, uncompiled: train.loss=full and chunked, and
train.attention=math in place of cudnn and flash (liger, cudnn and flash are not run there: the row says so).

Kept apart from gpu_check_parts.py, which calls `part_step` lazily (the two modules share its Part and steady)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import NamedTuple

from gpu_check_llama import LLAMA_SKIP
from gpu_check_parts import Part, mfu_text, peak_bytes, record, size, steady, train_rows

STEP_STEPS = 12  # compile and the first LLAMA_SKIP steps, then 7 steps for the medians
CPU_STEPS, CPU_SKIP = 5, 3  # the dry mode: the profiler's steps 1-2 (the peak) and the slow step after them


class Variant(NamedTuple):
    label: str  # as the row names it
    overrides: tuple[str, ...]
    must_run: bool  # its failure fails the part (a loss); an attention kernel may be refused by the GPU


LOSSES = [Variant(f"loss={name}", (f"train.loss={name}",), True) for name in ("full", "chunked", "liger")]
GPU_ATTENTION = [Variant(f"attention={name}", (f"train.attention={name}", "train.loss=auto"), False)
                 for name in ("cudnn", "flash")]
CPU_ATTENTION = [Variant("attention=math", ("train.attention=math", "train.loss=auto"), False)]


def not_run(variant: Variant, gpu: bool) -> str | None:
    """Why a variant is not launched here, or None."""
    from llmtrain.loss import liger_installed

    if variant.label == "loss=liger":
        if not gpu:
            return "not run on CPU (liger runs on CUDA only)"
        if not liger_installed():
            return "not installed (liger_kernel is not importable)"
    return None


def part_step(p: Part) -> tuple[str, str]:
    s = p.sizes
    gpu = s.device == "cuda"
    # As the llama part: llama3-1b at 2048 tokens, micro-batch 4 (global 8), compiled; on CPU a llama-tiny.
    model = (["model=llama3-1b", "model.seq_len=2048", "precision=bf16"] if gpu else
             ["model=llama-tiny", "model.n_layers=2", "model.seq_len=64", "precision=fp32"])
    steps, skip = (STEP_STEPS, LLAMA_SKIP) if gpu else (CPU_STEPS, CPU_SKIP)
    base = [*model, *s.batch(s.micro), f"train.max_steps={steps}", "train.warmup_steps=5", *s.peak,
            *(["optim.fused=torch", "train.compile=true"] if gpu else [])]
    variants = [*LOSSES, *(GPU_ATTENTION if gpu else CPU_ATTENTION)]
    keys = dict(o.split("=", 1) for o in model)
    head = f"{keys['model']} seq {keys['model.seq_len']} micro {s.micro}{', compiled' if gpu else ''}"
    parts, speeds, ok = [head], {}, True
    for variant in variants:
        why = not_run(variant, gpu)
        if why:
            parts.append(f"{variant.label} {why}")
            continue
        record(p.out, "step", "FAIL", f"{'; '.join(parts)}; {variant.label} did not finish",
               str(p.out / "logs" / "step.log"))  # the row left if the part is stopped during this run
        name = f"step-{variant.label.replace('=', '-')}"
        try:
            run = p.launch(name, [*base, *variant.overrides])
        except RuntimeError as e:
            ok &= not variant.must_run
            parts.append(f"{variant.label} failed ({e})")
            continue
        text, finite = figures_text(run, steps, skip)
        ok &= finite
        if finite:
            speeds[variant.label] = steady(run, skip)["tokens_per_s"]
        parts.append(f"{variant.label} {text}")
    if not gpu:
        parts.append("cudnn and flash attention not run on CPU (attention=math instead)")
    base_speed = speeds.get("loss=full")
    if speeds and base_speed:
        best = max(speeds, key=speeds.get)
        parts.append(f"fastest: {best} ({speeds[best] / base_speed:.3f}x loss=full)")
    else:
        ok = False
        parts.append("no fastest: loss=full did not run")
    return ("PASS" if ok else "FAIL"), "; ".join(parts) + f" (pass: every run's {steps} losses finite)"


def figures_text(run: Path, steps: int, skip: int) -> tuple[str, bool]:
    """A finished run's figures (tokens/s, MFU with its peak, peak memory), and whether it logged `steps` finite
    losses."""
    losses = [r["loss"] for r in train_rows(run)]
    finite = len(losses) == steps and all(math.isfinite(v) for v in losses)
    if not finite:
        return f"losses not finite or missing ({len(losses)} of {steps} steps logged)", False
    f = steady(run, skip)
    peak = peak_bytes(run)
    return (f"{f['tokens_per_s']:,.0f} tok/s, {mfu_text(f)}, peak {size(peak) if peak is not None else 'unknown'}",
            True)
