"""`llmtrain --help` from the real binary: every config group and its options, without importing torch."""

from __future__ import annotations

import re
import subprocess
import sys

from conftest import run_cli
from helpers.config_groups import GROUPS



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
    for group, options in GROUPS.items():
        assert [o.strip() for o in listed[group].split(",")] == options, group


def test_help_does_not_import_torch():
    code = ("import sys; from llmtrain.cli import build_parser; build_parser().format_help(); "
            "sys.exit('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0
