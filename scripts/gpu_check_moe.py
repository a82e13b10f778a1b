"""gpu_check.sh's MoE part: OLMoE's shape cut to 4 layers (64 experts of width 1024, 8 per token, d_model 2048) in
bf16, compiled, on one GPU: tokens/s and MFU (the trainer's MFU counts the FLOPs of the active parameters: the
router, the 8 chosen experts, attention and the head), with the experts run by torch._grouped_mm
(model.moe.grouped_mm=on) and by the per-expert loop (off).

Both runs start from the same weights and see the same batches, so their step-1 losses differ only by the kernels'
bf16 rounding: they must agree within MOE_LOSS_TOLERANCE, or the two paths do not compute the same model. Both
losses must fall. The grouped run goes first and its figures are recorded before the loop run starts, so a loop run
that overruns the part's limit still leaves the grouped figures in the summary (as a FAIL naming the loop run).
On CPU (the dry mode) moe-tiny in fp32, two layers, uncompiled.

Kept apart from gpu_check_parts.py, which calls `part_moe` lazily (the two modules share its Part and steady)."""

from __future__ import annotations

import math

from gpu_check_parts import Part, mfu_text, record, steady, train_rows

MOE_STEPS, MOE_SKIP = 10, 4  # on a GPU: compile and the first steps, then 6 timed steps
MOE_LOSS_TOLERANCE = 0.01  # relative, step 1: grouped against loop in bf16


def part_moe(p: Part) -> tuple[str, str]:
    s = p.sizes
    gpu = s.device == "cuda"
    model = (["model=olmoe-1b-7b", "model.n_layers=4", "model.seq_len=2048", "precision=bf16"] if gpu else
             ["model=moe-tiny", "model.n_layers=2", "model.seq_len=64", "precision=fp32"])
    steps, skip = (MOE_STEPS, MOE_SKIP) if gpu else (s.steps, s.skip)
    base = [*model, *s.batch(s.micro), f"train.max_steps={steps}", "train.warmup_steps=2",
            *(["optim.fused=torch", "train.compile=true"] if gpu else [])]
    name = model[0].split("=")[1] + " x 4 layers" if gpu else "moe-tiny x 2 layers"
    runs, figures = {}, {}
    for mode in ("on", "off"):
        runs[mode] = p.launch(f"moe-grouped-{mode}", [*base, f"model.moe.grouped_mm={mode}"])
        figures[mode] = steady(runs[mode], skip)
        if mode == "on":  # kept if the loop run does not finish within the part's limit
            record(p.out, "moe", "FAIL", f"{name}: grouped {_speed(figures['on'])}; the loop run did not finish",
                   str(p.out / "logs" / "moe.log"))
    losses = {mode: [r["loss"] for r in train_rows(run)] for mode, run in runs.items()}
    apart = abs(losses["on"][0] - losses["off"][0]) / abs(losses["off"][0])
    fell = all(len(v) == steps and all(map(math.isfinite, v)) and v[-1] < v[0] for v in losses.values())
    speedup = figures["on"]["tokens_per_s"] / figures["off"]["tokens_per_s"]
    ok = fell and apart <= MOE_LOSS_TOLERANCE
    return ("PASS" if ok else "FAIL"), (
        f"{name}, micro {s.micro}{', compiled' if gpu else ''}: grouped {_speed(figures['on'])}; loop "
        f"{_speed(figures['off'])}; grouped / loop {speedup:.3f}x; step-1 losses {apart:.1e} apart (pass <= "
        f"{MOE_LOSS_TOLERANCE:g}); losses {'fell' if fell else 'did not fall'} over {steps} steps")


def _speed(figures: dict) -> str:
    return f"{figures['tokens_per_s']:,.0f} tok/s, {mfu_text(figures)}"
