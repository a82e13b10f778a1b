"""gpu_check.sh's long-context part: llama3-1b at its 8192-token context in bf16 on one GPU, with the layout
`llmtrain plan --suggest 1 GIB --json` ranks first for the GPU's memory (its micro-batch, recompute mode and ZeRO
level, for a global batch of 8 sequences): tokens/s and MFU against the plan's estimate, and the measured peak of
steps 1-2 against the plan's peak (within PEAK_TOLERANCE). Uncompiled: the plan's memory model is the eager one,
and a first compile would take much of the part's limit.

On CPU (the dry mode) a two-layer llama-tiny at seq 256 in fp32 against the CPU's RAM, its peak from the profiler.

Kept apart from gpu_check_parts.py, which calls `part_long` lazily (the two modules share its Part and steady)."""

from __future__ import annotations

import math

from gpu_check_parts import (PEAK_TOLERANCE, Part, device_memory_gib, mfu_text, peak_bytes, size, steady,
                             suggest_plans, train_rows)

LONG_STEPS, LONG_SKIP = 10, 4  # on a GPU: the first steps (allocator warm-up), then 6 timed steps


def layout_overrides(plan: dict) -> list[str]:
    """The keys of a suggested single-device plan the launch sets: micro-batch, recompute mode, ZeRO level."""
    d = plan["dims"]
    return [f"train.micro_batch_size={d['micro_batch_size']}", f"recompute={d['recompute']}",
            f"parallel.zero={d['zero']}"]


def part_long(p: Part) -> tuple[str, str]:
    s = p.sizes
    gpu = s.device == "cuda"
    model = (["model=llama3-1b", "model.seq_len=8192", "precision=bf16"] if gpu else
             ["model=llama-tiny", "model.n_layers=2", "model.seq_len=256", "precision=fp32"])
    name = "llama3-1b seq 8192" if gpu else "llama-tiny x 2 layers seq 256"
    gib = device_memory_gib(s.device)
    batch = s.batch(s.micro)  # the global batch is 2 x the default micro-batch; the plan picks the micro-batch
    plans = suggest_plans([*model, *batch, *s.common()], gib)
    global_batch = [o for o in batch if o.startswith("train.global_batch_size=")]
    if not plans:
        return "FAIL", f"{name}: `llmtrain plan --suggest 1 {math.floor(gib)}` finds no layout that fits"
    plan, layout = plans[0], layout_overrides(plans[0])
    steps, skip = (LONG_STEPS, LONG_SKIP) if gpu else (s.steps, s.skip)
    run = p.launch("long", [*model, *global_batch, *layout, f"train.max_steps={steps}", "train.warmup_steps=2", *s.peak])
    figures = steady(run, skip)
    losses = [r["loss"] for r in train_rows(run)]
    measured, predicted = peak_bytes(run), plan["peak_bytes_per_rank"]
    finite = all(map(math.isfinite, losses))
    finished = len(losses) == steps and finite
    ratio = predicted / measured if measured else float("nan")
    ok = finished and abs(ratio - 1) <= PEAK_TOLERANCE
    peak = (f"peak {size(measured)} measured, plan {size(predicted)} ({ratio:.3f}x; pass within "
            f"{PEAK_TOLERANCE:.0%})" if measured else "no measured peak")
    return ("PASS" if ok else "FAIL"), (
        f"{name}, the plan's layout for {math.floor(gib)} GiB: {' '.join(layout)}: {figures['tokens_per_s']:,.0f} "
        f"tok/s (plan {plan['tokens_per_s']:,.0f}), {mfu_text(figures)}; {peak}; "
        f"{len(losses)} of {steps} steps{'' if finite else ', a loss not finite'}")
