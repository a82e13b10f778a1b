"""The run directory's JSON records that hold one list under one key (job.json's launches, goodput.json's starts,
spikes.json's rollbacks): read the same way, a missing or unreadable file being an empty record."""

from __future__ import annotations

import json


def read_entries(path: str, key: str) -> list[dict]:
    """The dict entries of `path`'s list under `key`, in order; [] when the file is missing or unreadable."""
    try:
        with open(path) as f:
            entries = json.load(f).get(key, [])
    except (OSError, ValueError, AttributeError):
        return []
    return [e for e in entries if isinstance(e, dict)] if isinstance(entries, list) else []
