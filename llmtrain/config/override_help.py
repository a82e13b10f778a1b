"""The overrides' help shown under `llmtrain --help` and each command that takes overrides: Hydra's grammar and
every built-in config group with its options."""

from __future__ import annotations


def config_groups_help() -> str:
    """One line per built-in config group (each folder of configs/) with its options: read from the folders, so
    the help cannot miss a group. Imports omegaconf (via compose), not torch, so --help stays fast."""
    import textwrap

    try:
        from llmtrain.config.compose import builtin_config_dir

        groups = sorted((d for d in builtin_config_dir().iterdir() if d.is_dir() and d.name[0] not in "._"),
                        key=lambda d: d.name)
        width = max(len(d.name) for d in groups) + 2
        return "\n".join(textwrap.fill(", ".join(sorted(f.stem for f in d.glob("*.yaml"))),
                                       width=100,
                                       initial_indent=f"  {d.name:<{width}}", subsequent_indent=" " * (width + 2),
                                       break_on_hyphens=False)
                         for d in groups)
    except (OSError, ImportError, ValueError):  # no readable configs/: the commands will say so
        return "  (the folders of configs/)"


OVERRIDE_HELP = """\
overrides use Hydra's grammar:
  key=value          set a key            train.max_steps=100 parallel.tp=2
  group=option       pick a config file   model=gpt-1.3b precision=bf16 data=memmap cluster=local
  +key=value         add a key            +env.NCCL_DEBUG=INFO
  ~key               delete a key         ~env.NCCL_DEBUG
config groups (configs/<group>/<option>.yaml) and their options:
""" + config_groups_help() + """
add your own with --config-dir DIR (its options shadow the built-in ones).
"""
