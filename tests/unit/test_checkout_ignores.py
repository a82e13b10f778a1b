"""The folders llmtrain's commands write into by default or in the docs' examples are ignored by git, so running
them in a checkout leaves no untracked output behind."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _ignored_folders() -> set[str]:
    lines = (REPO / ".gitignore").read_text().splitlines()
    return {line.strip("/") for line in lines if line.endswith("/")}


def test_documented_output_folders_are_ignored():
    texts = [(REPO / "README.md").read_text(), *(p.read_text() for p in sorted((REPO / "docs").glob("*.md")))]
    # A relative run.dir in a folder of its own (`run.dir=tunes/tiny`): the folder a checkout gains.
    folders = {m for text in texts for m in re.findall(r"run\.dir=([A-Za-z_][\w.-]*)/\w", text)}
    assert "tunes" in folders
    assert {"runs", *folders} <= _ignored_folders()
