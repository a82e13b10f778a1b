"""Every config group (a folder of configs/) is named, with its options, in `llmtrain --help` and in docs/configs.md."""

from __future__ import annotations

import re

from conftest import REPO
from helpers.config_groups import GROUPS


def test_the_builtin_configs_have_groups():
    assert {"model", "precision", "recompute", "hardware", "data", "cluster", "network", "train",
            "parallel"} <= set(GROUPS)


def test_readme_group_table_has_every_config_group():
    readme = (REPO / "docs" / "configs.md").read_text()
    section = readme.split("## Configs and overrides", 1)[1].split("\n## ", 1)[0]
    header = section.index("| group | options | keys |")
    table = section[header:].split("\n\n", 1)[0].splitlines()[2:]  # skip the header and |---| lines
    rows = {m.group(1) for line in table if (m := re.match(r"\| `([\w-]+)` \|", line))}
    assert set(GROUPS) <= rows, f"docs/configs.md's group table lacks {sorted(set(GROUPS) - rows)}"
