"""Naming the rank that failed from torchrun's summary and the ranks' status files."""

import json

from llmtrain.launch.monitor import failed_ranks

SUMMARY = """Failures:
[1]:
  time      : 2026-11-29_16:00:01
  host      : vm
  rank      : 0 (local_rank: 0)
  exitcode  : 1 (pid: 12)
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-29_16:00:00
  host      : vm
  rank      : 2 (local_rank: 0)
  exitcode  : 1 (pid: 11)
"""


def test_a_rank_killed_by_a_signal_comes_first(tmp_path):
    (tmp_path / "logs").mkdir()
    for rank in (0, 2):  # these two recorded errors (a peer vanished)
        (tmp_path / "logs" / f"rank{rank}.status").write_text(json.dumps({"status": "error"}))
    killed = SUMMARY + "[2]:\n  rank      : 1 (local_rank: 1)\n  exitcode  : -9 (pid: 13)\n"
    assert failed_ranks(str(tmp_path), killed)[0] == 1
    # Without a silent death, torchrun's root cause leads.
    assert failed_ranks(str(tmp_path), SUMMARY)[:2] == [2, 0]


def test_status_files_alone(tmp_path):
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "rank3.status").write_text(json.dumps({"status": "error"}))
    (tmp_path / "logs" / "rank1.status").write_text(json.dumps({"status": "ok"}))
    assert failed_ranks(str(tmp_path), "") == [3]
