"""The measured fastest layout as a config option: TUNE_DIR/best/parallel/tuned.yaml, which
`llmtrain launch --config-dir TUNE_DIR/best parallel=tuned ...` composes (a user config folder's options sit beside
the built-in ones; `# @package _global_` lets the option set keys of other sections). It holds the layout's keys,
train.compile and optim.fused (a refinement's value when one won, else the configured one) and the global batch
the trials kept, so the launched run trains as the tune measured."""

from __future__ import annotations

import os
import shlex

from llmtrain.rundir.atomic import atomic_write_text
from llmtrain.tune.candidates import LAYOUT_KEYS
from llmtrain.tune.refine import REFINE_KEYS

OPTION = "tuned"


def best_dir(tune_dir: str) -> str:
    return os.path.join(tune_dir, "best")


def launch_overrides(user_overrides: list[str]) -> list[str]:
    """The tune's overrides for the real run: parallel=tuned in place of the layout's keys and the refined ones
    (tuned.yaml holds the winner's); no run.dir (that named the tune's folder)."""
    dropped = {*LAYOUT_KEYS, *REFINE_KEYS, "train.global_batch_size", "run.dir", "parallel"}
    kept = [o for o in user_overrides if o.split("=", 1)[0].lstrip("+~") not in dropped]
    return [f"parallel={OPTION}", *kept]


def launch_line(tune_dir: str, config_dirs: list[str], user_overrides: list[str]) -> str:
    dirs = [*config_dirs, _shown(best_dir(tune_dir))]
    args = ["llmtrain", "launch", *(a for d in dirs for a in ("--config-dir", d)), *launch_overrides(user_overrides)]
    return shlex.join(args)


def _shown(path: str) -> str:
    """Relative to the working directory when inside it: the line stays short and works from a checkout."""
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


def write(tune_dir: str, layout_overrides: list[str], global_batch: int, line: str, table_note: str) -> str:
    """Write the option (the layout's KEY=VALUE overrides as YAML) atomically; its path."""
    folder = os.path.join(best_dir(tune_dir), "parallel")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{OPTION}.yaml")
    sections: dict[str, dict] = {}
    for override in [*layout_overrides, f"train.global_batch_size={global_batch}"]:
        key, value = override.split("=", 1)
        section, name = key.split(".")
        sections.setdefault(section, {})[name] = value
    lines = ["# @package _global_", f"# Written by `llmtrain tune`: {table_note}", f"#   {line}"]
    for section, values in sections.items():
        lines.append(f"{section}:")
        lines += [f"  {name}: {value}" for name, value in values.items()]
    atomic_write_text(path, "\n".join(lines) + "\n")
    return path
