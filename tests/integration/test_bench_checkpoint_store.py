"""scripts/bench_checkpoint_store.py in its smallest mode (--quick: gpt-tiny against the moto server it starts
itself): every way of saving leaves a complete checkpoint in its place, the same state is the same DCP bytes on
disk and in the store, and the background modes give training its steps back while the store catches up."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_checkpoint_store.py"
MODES = ["local", "store", "store async", "fast tier", "fast + async"]


def test_quick_benchmark_saves_every_mode_completely_and_prints_one_table(tmp_path):
    pytest.importorskip("moto.server", reason="moto[server] is not installed (pip install -e '.[test]')")
    pytest.importorskip("s3fs", reason="s3fs is not installed (pip install -e '.[test]')")
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--workdir", str(tmp_path), "--out", str(out)],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    modes = result["modes"]
    assert list(modes) == MODES and result["model"] == "gpt-tiny" and result["warnings"] == []
    # Each save is checked complete by the script (meta.json, every file at its size); it went where it should.
    assert modes["local"]["path"].startswith(str(tmp_path))
    for mode in MODES[1:]:
        assert modes[mode]["path"].startswith("s3://docs-bench/bench-"), mode
    # DCP's shard file and index, and config.yaml; the same state is the same shard bytes wherever it goes.
    assert {tuple(m["file_bytes"]) for m in modes.values()} == {(".metadata", "__0_0.distcp", "config.yaml")}
    assert len({m["shard_bytes"] for m in modes.values()}) == 1
    assert modes["store"]["shard_bytes"] >= 12 * result["params"]  # fp32 weights and two AdamW moments
    # Background saves: the call returns before the store has the checkpoint, and training steps meanwhile.
    for mode in ("store async", "fast tier", "fast + async"):
        assert modes[mode]["blocked_s"] < modes[mode]["committed_s"], mode
        assert modes[mode]["steps_during"] >= 1, mode
    assert modes["store async"]["blocked_s"] < modes["store"]["blocked_s"]
    fractions = result["fraction_of_sync_store"]
    assert fractions["store"] == 1.0
    assert fractions["fast + async"] == pytest.approx(modes["fast + async"]["blocked_s"] / modes["store"]["blocked_s"])
    # One table: its header, then a row per mode in order.
    lines = proc.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("mode "))
    assert [line[:14].rstrip() for line in lines[header + 1:header + 6]] == MODES
    assert lines[header + 6].startswith("target: blocked <= 10% of the synchronous store save: store async ")
