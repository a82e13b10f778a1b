"""What scripts/gpu_check.sh runs: its parts' time limits, the default parts, the three `--long` groups, and the
plan (deadline, then each part with its limit) that `gpu_check_parts.py plan` prints.

A GPU loan is 15 minutes, its machine's start included. The default parts fit a 6-minute deadline; each `--long`
group fits 8 minutes, so one group and the machine's start fit one loan. Every limit is about 1.3-1.5x the part's
time measured on one H200 (2026-12-04, torch 2.11), or an estimate where the part was never timed there.
"""

from __future__ import annotations

import argparse
from typing import NamedTuple


class Limit(NamedTuple):
    seconds: float  # the part's time limit on a GPU
    measured: float | None  # the part's time measured on one H200; None: the limit is an estimate
    basis: str = ""  # what the measured time or the estimate stands on


# The parts' limits, without the gpt-1.3b defaults run that throughput, plain, memory and tune share: the first of
# them in a plan makes that run (or reuses it from an earlier check in the same OUTDIR) and gets DEFAULTS_RUN's
# limit on top of its own.
LIMITS = {
    "smoke": Limit(40, None, "a gpt-tiny launch of 20 steps"),
    "throughput": Limit(100, None, "its compiled micro-8 run: ~40 s start-up, a 15 s first step, 14 more steps"),
    "plain": Limit(50, 35),
    "fp16": Limit(50, None, "a gpt-125m launch of 10 steps"),
    "memory": Limit(60, 41),
    "resume": Limit(110, 80),
    "async_save": Limit(90, None, "gpt-125m, 2 sync and 2 async saves"),
    "apex": Limit(45, None, "a gpt-125m launch of 10 steps; SKIP at once without apex"),
    "fp8": Limit(180, None, "two compiled gpt-1.3b launches of 30 steps"),
    "llama": Limit(330, None, "three compiled launches of 30 steps; two of 15 steps took 156 s"),
    "tune": Limit(150, None, "three gpt-1.3b trials of 10 steps, ~35 s each"),
    "moe": Limit(150, None, "two compiled launches of 10 steps"),
    "long": Limit(75, None, "one llama3-1b launch of 10 steps at seq 8192"),
    "step": Limit(450, None, "five compiled llama3-1b launches of 12 steps, four without liger_kernel; llama's two "
                             "of 15 steps took 156 s"),
}
DEFAULTS_RUN = Limit(70, 51)
USES_DEFAULTS_RUN = ("throughput", "plain", "memory", "tune")

DEFAULT_PARTS = ("throughput", "memory", "resume")
DEFAULT_DEADLINE_S = 360
# step's launches fill a loan of their own: groups 1 and 2 have no room left for them.
GROUPS = {1: ("llama", "long", "fp16"), 2: ("plain", "tune", "moe", "smoke"), 3: ("step",)}
GROUP_DEADLINE_S = 480
# Not in a group (`--parts NAME` runs them): llama's fp8 recipes cover fp8 against bf16, apex is rarely installed
# (it needs a build), and the async save's cost is measured on CPU (planning.md).
PARTS_ONLY = ("fp8", "async_save", "apex")
CPU_FACTOR = 3  # the dry mode's limits and deadline: 2 shared cores run the tiny models slower than a GPU


def limit_of(part: str, makes_defaults_run: bool) -> float:
    return LIMITS[part].seconds + (DEFAULTS_RUN.seconds if makes_defaults_run else 0)


def where_run(part: str) -> str:
    """The option that runs a part, for the summary's row of a part that was not asked for."""
    if part in DEFAULT_PARTS:
        return "the default run"
    group = next((g for g, parts in GROUPS.items() if part in parts), None)
    return f"--long {group}" if group else f"--parts {part}"


def parse_group(value: str | None) -> int:
    """`--long` alone is group 1; `--long 2` (or `--long=2`) group 2, and so on."""
    if value in (None, ""):
        return 1
    try:
        group = int(value)
    except ValueError:
        group = 0
    if group not in GROUPS:
        raise SystemExit(f"gpu_check: --long {value}: the groups are {', '.join(map(str, GROUPS))}")
    return group


def plan(parts: str | None, group: int | None, deadline: float | None,
         device: str) -> tuple[float, list[tuple[str, float]]]:
    """(the check's deadline in seconds from its start, [(part, time limit in seconds)] in order). `parts`: names,
    each with an optional `:SECONDS`, separated by commas or spaces; else `group` (None: the default parts)."""
    factor = CPU_FACTOR if device == "cpu" else 1
    names = parts or " ".join(GROUPS[group] if group else DEFAULT_PARTS)
    chosen, defaults_made = [], False
    for entry in names.replace(",", " ").split():
        name, _, given = entry.partition(":")
        if name not in LIMITS:
            raise SystemExit(f"gpu_check: unknown part {name!r} in --parts; the parts: {', '.join(LIMITS)}")
        makes = name in USES_DEFAULTS_RUN and not defaults_made
        defaults_made |= makes
        try:
            chosen.append((name, float(given) if given else limit_of(name, makes) * factor))
        except ValueError:
            raise SystemExit(f"gpu_check: --parts {entry}: the time limit must be seconds") from None
    if deadline is None:
        if parts:  # parts named: their limits and the start-up slack of the default run
            deadline = sum(limit for _, limit in chosen) + (DEFAULT_DEADLINE_S - default_limits_s()) * factor
        else:
            deadline = (GROUP_DEADLINE_S if group else DEFAULT_DEADLINE_S) * factor
    return deadline, chosen


def default_limits_s() -> float:
    return sum(limit for _, limit in plan(None, None, None, "cuda")[1])


def describe(part: str, limit: float, makes_defaults_run: bool) -> str:
    """One row of the human plan: the limit, and whether it stands on a measured time or an estimate."""
    own = LIMITS[part]
    basis = f"measured {own.measured:g} s" if own.measured is not None else f"(estimate) {own.basis}"
    if makes_defaults_run:
        basis += f"; with the gpt-1.3b defaults run (measured {DEFAULTS_RUN.measured:g} s, limit " \
                 f"{DEFAULTS_RUN.seconds:g} s)"
    return f"  {part:<11} {limit:>5g} s  {basis}"


def table(title: str, deadline: float, chosen: list[tuple[str, float]]) -> list[str]:
    lines = [f"{title}: deadline {deadline:g} s from the check's start; limits add up to "
             f"{sum(limit for _, limit in chosen):g} s"]
    made = False
    for name, limit in chosen:
        makes = name in USES_DEFAULTS_RUN and not made
        made |= makes
        lines.append(describe(name, limit, makes))
    return lines


def plan_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="gpu_check_parts.py plan")
    ap.add_argument("--long", nargs="?", const="", default=None, metavar="GROUP",
                    help="a group of the long parts: 1 (also --long alone), 2 or 3; the human plan of --long "
                         "alone shows them all")
    ap.add_argument("--parts", default=None, help="NAME[:SECONDS],... to run, in this order")
    ap.add_argument("--deadline", type=float, default=None, help="seconds from the check's start")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--shell", action="store_true", help="what gpu_check.sh reads: the deadline, then PART:SECONDS")
    a = ap.parse_args(argv)
    group = parse_group(a.long) if a.long is not None else None
    deadline, chosen = plan(a.parts, group, a.deadline, a.device)
    if a.shell:
        print(f"{deadline:g}")
        print(" ".join(f"{name}:{limit:g}" for name, limit in chosen))
        return 0
    where = "one H200" if a.device == "cuda" else f"CPU dry mode, {CPU_FACTOR}x the GPU's"
    if a.parts:
        print("\n".join(table(f"parts {a.parts} ({where})", deadline, chosen)))
    elif group is None:
        print("\n".join(table(f"default parts ({where})", deadline, chosen)))
    else:
        shown = GROUPS if a.long == "" and a.deadline is None else [group]
        for g in shown:
            d, c = plan(None, g, a.deadline, a.device)
            print("\n".join(table(f"--long {g} ({where})", d, c)))
        print(f"only with --parts: {' '.join(PARTS_ONLY)}")
    return 0
