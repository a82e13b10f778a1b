"""gpu_check.sh's Llama part: llama3-1b in bf16 (tokens/s, MFU), then each fp8 recipe against it, all compiled
and FP8_STEPS steps long: tokens/s, and the loss after FP8_STEPS steps within FP8_LOSS_TOLERANCE of bf16's. The
row names the fastest recipe that keeps the loss within that tolerance. Each run's figures are recorded as soon as
it ends, so a part stopped at its limit still shows the runs that finished.

Kept apart from gpu_check_parts.py, which calls `part_llama` lazily (the two modules share its Part and steady)."""

from __future__ import annotations

from gpu_check_fp8 import FP8_LOSS_TOLERANCE, FP8_STEPS, MIN_FP8_SPEEDUP, compare_losses
from gpu_check_parts import Part, mfu_text, record, steady, train_rows

RECIPES = ("tensorwise", "rowwise")  # precision.fp8_recipe values compared against bf16
LLAMA_SKIP = 5  # compile and the first steps: left out of the tokens/s medians


def part_llama(p: Part) -> tuple[str, str]:
    from llmtrain.config import compose_config
    from llmtrain.launch.config_probes import fp8_problem

    s = p.sizes
    gpu = s.device == "cuda"
    # llama3-1b at a 2048-token context (its 8192 default needs more memory than one GPU's micro-batch of 4 leaves
    # for a quick check); on CPU a llama-tiny of two layers in fp32.
    model = (["model=llama3-1b", "model.seq_len=2048", "precision=bf16"] if gpu else
             ["model=llama-tiny", "model.n_layers=2", "model.seq_len=64", "precision=fp32"])
    steps, skip = (FP8_STEPS, LLAMA_SKIP) if gpu else (s.steps, s.skip)
    base = [*model, *s.batch(s.micro), f"train.max_steps={steps}", "train.warmup_steps=5",
            *(["optim.fused=torch", "train.compile=true"] if gpu else [])]
    runs = {"bf16": p.launch("llama-bf16", base)}
    bf16 = steady(runs["bf16"], skip)
    bf16_losses = [r["loss"] for r in train_rows(runs["bf16"])]
    fell = bf16_losses[0] - bf16_losses[-1]  # agreeing losses say little unless they fell
    detail = (f"{model[0].split('=')[1]} micro {s.micro}{', compiled' if gpu else ''}: bf16 "
              f"{bf16['tokens_per_s']:,.0f} tok/s, {mfu_text(bf16)}, loss {bf16_losses[0]:.3f} -> "
              f"{bf16_losses[-1]:.3f}")
    fp8_base = [o for o in base if not o.startswith("precision=")] + ["precision=fp8"]
    problem = fp8_problem(compose_config([*fp8_base, *s.common()]))
    if problem:  # the CPU dry mode, a GPU below compute capability 8.9, no torchao
        return "PASS", f"{detail}; fp8 not run: {problem}"
    parts, kept = [detail], {}
    for recipe in RECIPES:
        _unfinished(p, parts, recipe)
        runs[recipe] = p.launch(f"llama-fp8-{recipe}", [*fp8_base, f"precision.fp8_recipe={recipe}"])
        figures = steady(runs[recipe], skip)
        losses = compare_losses(p, runs["bf16"], runs[recipe])
        ratio = figures["tokens_per_s"] / bf16["tokens_per_s"]
        if losses.last == FP8_STEPS and losses.apart <= FP8_LOSS_TOLERANCE:
            kept[recipe] = ratio
        parts.append(f"fp8 {recipe} {figures['tokens_per_s']:,.0f} tok/s ({ratio:.3f}x bf16), {mfu_text(figures)}, "
                     f"loss at step {losses.last} {losses.apart:.2%} from bf16's")
    best = max(kept, key=kept.get) if kept else None
    ok = len(kept) == len(RECIPES) and kept[best] >= MIN_FP8_SPEEDUP and fell > 1.0
    verdict = (f"fastest within {FP8_LOSS_TOLERANCE:.0%}: {best} ({kept[best]:.3f}x bf16)" if best else
               f"no recipe keeps the loss within {FP8_LOSS_TOLERANCE:.0%}")
    return ("PASS" if ok else "FAIL"), (
        f"{'; '.join(parts)}; {verdict} (pass: every recipe's loss at step {FP8_STEPS} within "
        f"{FP8_LOSS_TOLERANCE:.0%} of bf16's, which fell by more than 1, the fastest >= {MIN_FP8_SPEEDUP:g}x bf16)")


def _unfinished(p: Part, parts: list[str], recipe: str) -> None:
    """The row the part leaves if it is stopped during `recipe`'s run: the figures so far."""
    record(p.out, "llama", "FAIL", f"{'; '.join(parts)}; fp8 {recipe} did not finish",
           str(p.out / "logs" / "llama.log"))
