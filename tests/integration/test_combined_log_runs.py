"""The combined log of real launches, and the merger process stopped by SIGTERM."""

from __future__ import annotations

import re
import subprocess
import sys

from conftest import SMALL, launch


def test_local_launches_write_one_combined_log_with_a_separator_each(tmp_path):
    run_dir = tmp_path / "run"
    common = [*SMALL, "cluster.nproc_per_node=2", "train.global_batch_size=4", "train.micro_batch_size=2"]
    launch(run_dir, *common, "train.max_steps=3")
    launch(run_dir, *common, "train.max_steps=5")
    text = (run_dir / "logs" / "combined.log").read_text()
    separators = re.findall(r"^===== launch (\d+), .* =====$", text, re.MULTILINE)
    assert separators == ["1", "2"], text[:2000]
    second = text.split("===== launch 2,", 1)[1]
    # Rank 0's progress, prefixed with its node and rank; nothing of the first launch repeated after its separator.
    assert re.search(r"^\[0/0\] step +5/5 \| loss", second, re.MULTILINE), second[-2000:]
    assert not re.search(r"^\[0/0\] step +[123]/", second, re.MULTILINE), second[-2000:]
    assert all(re.match(r"\[(\d|\?)/[01]\] |===== launch", line) for line in text.splitlines()), text[:2000]


def test_merger_stops_on_sigterm_after_a_last_read(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "llmtrain.launch.supervision.combined_log", str(tmp_path)],
                            env={"SLURM_JOB_ID": "77", "SLURM_RESTART_COUNT": "1", "PATH": "/usr/bin:/bin",
                                 "PYTHONPATH": ":".join(sys.path)})
    try:
        import time

        deadline = time.monotonic() + 30
        while not (logs / "combined.log").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        (logs / "rank0.log").write_text("last words\n")
        proc.terminate()
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()
    lines = (logs / "combined.log").read_text().splitlines()
    assert lines[0].startswith("===== launch 1 (Slurm job 77, restart 1), ")
    assert lines[1:] == ["[?/0] last words"]
