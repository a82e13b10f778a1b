"""gpu_check.sh's tune part: `llmtrain tune` of the big model on one device (the plan's top 3 layouts, 10 steps
each), then the winner's MFU against the defaults' run.

Kept apart from gpu_check_parts.py, which calls `part_tune` lazily (the two modules share its Part and steady)."""

from __future__ import annotations

import os
import sys

from gpu_check_parts import Part, mfu_text, steady

TOP, STEPS = 3, 10
WARMUP = 3  # the tune's own warm-up at 10 steps: its medians are over steps 4-10


def part_tune(p: Part) -> tuple[str, str]:
    s = p.sizes
    tune_dir = p.runs / "tune"
    # The check's own calibration file: a check leaves the machine's plan as it found it.
    env = dict(os.environ, LLMTRAIN_CACHE=str(p.out / "tune-cache"))
    argv = [sys.executable, "-m", "llmtrain", "tune", f"run.dir={tune_dir}", *s.common(), *s.big, *s.batch(s.micro),
            "--top", str(TOP), "--steps", str(STEPS), "--no-refine"]  # compiling 1.3B would not fit the part's time
    proc = p.run(argv, capture=True, env=env)
    if proc.returncode:
        raise RuntimeError(f"llmtrain tune failed (exit {proc.returncode}); see {tune_dir}")
    winner = next(line.split("fastest measured: ", 1)[1].split(" ", 1)[0] for line in proc.stdout.splitlines()
                  if "tune: fastest measured: " in line)
    best = steady(tune_dir / winner, WARMUP)
    base = steady(p.defaults_run(), s.skip)
    calibrated = next((line.split("the plan is now ", 1)[1] for line in proc.stdout.splitlines()
                       if "the plan is now " in line), "not calibrated")
    return "PASS", (f"winner {winner}: {best['tokens_per_s']:,.0f} tok/s, {mfu_text(best)}; defaults "
                    f"(micro {s.micro}): {base['tokens_per_s']:,.0f} tok/s, {mfu_text(base)}; {calibrated}")
