"""gpu_check.sh's fp8 comparisons: a run in fp8 (torchao float8) against the same run in bf16, both compiled, by
their losses after FP8_STEPS steps (within FP8_LOSS_TOLERANCE) and their tokens/s. The `fp8` part compares
gpt-1.3b with the default recipe; the `llama` part (gpu_check_llama.py) compares each recipe on llama3-1b.

Kept apart from gpu_check_parts.py, which calls `part_fp8` lazily (the two modules share its Part and steady)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import NamedTuple

from gpu_check_parts import Part, steady

FP8_STEPS = 30  # enough for the loss to fall well below its start, so agreeing losses mean something
FP8_LOSS_TOLERANCE = 0.01  # relative difference of fp8's and bf16's loss at the last step
MIN_FP8_SPEEDUP = 1.0  # fp8 tokens/s / bf16 tokens/s, both compiled


class Losses(NamedTuple):
    last: int  # the last step both runs logged (FP8_STEPS when both finished)
    bf16: float  # bf16's loss there
    fp8: float  # fp8's loss there
    apart: float  # |fp8 - bf16| / bf16 at that step
    fell: float  # how far bf16's loss fell from its first step
    worst: int | None  # the step of the largest divergence
    worst_diff: float

    @property
    def ok(self) -> bool:
        return self.last == FP8_STEPS and self.apart <= FP8_LOSS_TOLERANCE and self.fell > 1.0


def compare_losses(p: Part, bf16_run: Path, fp8_run: Path) -> Losses:
    """The two runs' losses by llmtrain's own comparison (`llmtrain compare` into the log, its divergence for the
    figures)."""
    from llmtrain.report.compare import divergence, load_runs

    p.run([sys.executable, "-m", "llmtrain", "compare", str(bf16_run), str(fp8_run)])  # the table, into the log
    (bf16, fp8), _ = load_runs([str(bf16_run), str(fp8_run)])
    a, b = bf16.series("loss"), fp8.series("loss")
    common, worst, worst_diff = divergence(a, b)
    if not common:
        return Losses(0, float("nan"), float("nan"), float("inf"), 0.0, None, 0.0)
    last = common[-1]
    return Losses(last, a[last], b[last], abs(b[last] - a[last]) / a[last], a[common[0]] - a[last], worst,
                  worst_diff)


def loss_text(losses: Losses) -> str:
    return (f"loss at step {losses.last}: fp8 {losses.fp8:.4f}, bf16 {losses.bf16:.4f}, {losses.apart:.2%} apart "
            f"(pass <= {FP8_LOSS_TOLERANCE:.0%} at step {FP8_STEPS}; bf16 fell {losses.fell:.2f} from step 1; "
            f"largest divergence {losses.worst_diff:.3e} at step {losses.worst})")


def part_fp8(p: Part) -> tuple[str, str]:
    """gpt-1.3b with train.compile=true in bf16 and in fp8: tokens/s and the losses after FP8_STEPS steps."""
    from llmtrain.config import compose_config
    from llmtrain.launch.config_probes import fp8_problem

    s = p.sizes
    base = [o for o in s.big if not o.startswith("precision=")]
    base += [*s.batch(s.micro), "optim.fused=torch", "train.compile=true", f"train.max_steps={FP8_STEPS}",
             "train.warmup_steps=5"]
    problem = fp8_problem(compose_config([*base, "precision=fp8", *s.common()]))
    if problem:  # the CPU dry mode, a GPU below compute capability 8.9, no torchao
        return "SKIP", problem
    runs = {name: p.launch(f"fp8-{name}", [*base, f"precision={name}"]) for name in ("bf16", "fp8")}
    losses = compare_losses(p, runs["bf16"], runs["fp8"])
    speed = {name: steady(run, s.skip)["tokens_per_s"] for name, run in runs.items()}
    ratio = speed["fp8"] / speed["bf16"]
    return ("PASS" if losses.ok and ratio >= MIN_FP8_SPEEDUP else "FAIL"), (
        f"gpt-1.3b micro {s.micro}, compiled: fp8 {speed['fp8']:,.0f} / bf16 {speed['bf16']:,.0f} tok/s = "
        f"{ratio:.3f}x (pass >= {MIN_FP8_SPEEDUP:g}); {loss_text(losses)}")
