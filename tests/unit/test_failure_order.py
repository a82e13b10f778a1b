"""Which failed rank is named first: a storage error, then silent deaths (earliest first), then torchrun's root
cause, then the rest; and which node is the culprit."""

import json

from llmtrain.launch.supervision.failures import _ordered, agent_failures, culprit_node

SUMMARY = """
Failures:
[1]:
  time      : 2026-01-01_10:00:05
  host      : node1
  rank      : 3 (local_rank: 1)
  exitcode  : -15 (pid: 11)
[2]:
  time      : 2026-01-01_10:00:05
  host      : node1
  rank      : 2 (local_rank: 0)
  exitcode  : -9 (pid: 12)
Root Cause (first observed failure):
[0]:
  time      : 2026-01-01_10:00:04
  host      : node1
  rank      : 1 (local_rank: 1)
  exitcode  : 1 (pid: 13)
"""


def test_torchrun_summary_is_parsed_whole():
    failures = agent_failures(SUMMARY)
    assert sorted(failures) == [1, 2, 3]
    assert (failures[2].code, failures[2].local_rank, failures[2].host) == (-9, 0, "node1")


def test_silent_death_comes_before_the_root_cause_and_sigterm_last_in_its_second():
    statuses = {1: {"status": "error", "error": "connection reset"}}
    assert _ordered(agent_failures(SUMMARY), statuses, SUMMARY) == [2, 3, 1]


def test_a_storage_error_comes_first():
    statuses = {1: {"status": "error", "error": "OSError: [Errno 28] No space left on device"},
                2: {"status": "error", "error": "connection reset"}, 3: {"status": "error", "error": "timeout"}}
    failures = {r: f for r, f in agent_failures(SUMMARY).items() if r != 2}
    assert _ordered(failures, statuses, SUMMARY)[0] == 1


def test_the_culprit_node_is_the_one_with_a_silent_death(tmp_path):
    (tmp_path / "logs").mkdir()
    for rank in (1, 2, 3):  # node 0's ranks recorded an error each
        (tmp_path / "logs" / f"rank{rank}.status").write_text(json.dumps({"status": "error", "error": "reset"}))
    errored = SUMMARY.split("Root Cause")[0].replace("exitcode  : -9", "exitcode  : 1").replace(
        "exitcode  : -15", "exitcode  : 1")
    silent = "Failures:\n[1]:\n  host : node2\n  rank : 5 (local_rank: 1)\n  exitcode : -9 (pid: 1)\n"
    # Node 0 failed first but only with errors; node 1's rank died without a word.
    assert culprit_node(str(tmp_path), [errored, silent], [1, 1], [0, 1]) == 1
    assert culprit_node(str(tmp_path), [errored, errored], [1, 1], [1, 0]) == 1  # equals: the first failure
