"""Every config group (a folder of configs/) is named, with its options, in `llmtrain --help` and in docs/configs.md."""

from __future__ import annotations

import re
import subprocess
import sys

from conftest import REPO, run_cli

from llmtrain.config import builtin_config_dir
from llmtrain.config.validate import RETIRED_OPTIONS

GROUPS = {d.name: sorted(f.stem for f in d.glob("*.yaml"))
          for d in builtin_config_dir().iterdir() if d.is_dir() and d.name[0] not in "._"}


def test_the_builtin_configs_have_groups():
    assert {"model", "precision", "recompute", "hardware", "data", "cluster", "network", "train",
            "parallel"} <= set(GROUPS)


def test_help_lists_every_config_group_and_its_options():
    result = run_cli(["--help"])
    assert result.returncode == 0, result.stderr
    section = result.stdout.split("config groups (configs/<group>/<option>.yaml)", 1)[1]
    section = section.split("add your own with --config-dir", 1)[0]
    listed: dict[str, str] = {}
    for line in section.splitlines()[1:]:
        if re.match(r"  \S", line):  # "  group   option, option, ..."; wrapped options continue indented
            group, _, options = line.strip().partition(" ")
            listed[group] = options
        elif line.strip():
            listed[group] += " " + line.strip()
    assert set(listed) == set(GROUPS)
    for group, options in GROUPS.items():  # every option but the retired ones (apex-o1, apex-o2)
        usable = [o for o in options if o not in RETIRED_OPTIONS.get(group, ())]
        assert [o.strip() for o in listed[group].split(",")] == usable, group


def test_help_does_not_import_torch():
    code = ("import sys; from llmtrain.cli import build_parser; build_parser().format_help(); "
            "sys.exit('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0


def test_readme_group_table_has_every_config_group():
    readme = (REPO / "docs" / "configs.md").read_text()
    section = readme.split("## Configs and overrides", 1)[1].split("\n## ", 1)[0]
    header = section.index("| group | options | keys |")
    table = section[header:].split("\n\n", 1)[0].splitlines()[2:]  # skip the header and |---| lines
    rows = {m.group(1) for line in table if (m := re.match(r"\| `([\w-]+)` \|", line))}
    assert set(GROUPS) <= rows, f"docs/configs.md's group table lacks {sorted(set(GROUPS) - rows)}"
