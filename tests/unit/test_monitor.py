"""Naming the rank that failed from torchrun's summary and the ranks' status files."""

import json

from rich.console import Console

from llmtrain.launch.supervision.failures import culprit_node, failed_ranks, report_failure

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


def _summary(rank: int, code: int, host: str) -> str:
    return (f"Root Cause (first observed failure):\n[0]:\n  host      : {host}\n  rank      : {rank} (local_rank: 0)\n"
            f"  exitcode  : {code} (pid: 7)\n")


def test_the_node_whose_rank_was_killed_is_the_culprit_even_when_it_failed_second(tmp_path):
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "rank0.status").write_text(json.dumps({"status": "error"}))  # lost its peer
    outputs = [_summary(0, 1, "node1"), _summary(1, -9, "node2")]
    assert culprit_node(str(tmp_path), outputs, [1, 1], failure_order=[0, 1]) == 1
    # Both only errored: the first to fail is named.
    (tmp_path / "logs" / "rank1.status").write_text(json.dumps({"status": "error"}))
    outputs[1] = _summary(1, 1, "node2")
    assert culprit_node(str(tmp_path), outputs, [1, 1], failure_order=[0, 1]) == 0
    # A node whose ssh connection broke (exit 255, no summary) comes before nodes whose ranks errored.
    assert culprit_node(str(tmp_path), [outputs[0], "", outputs[1]], [1, 255, 1], failure_order=[0, 2, 1]) == 1
    # A node still running is never named.
    assert culprit_node(str(tmp_path), outputs, [1, None], failure_order=[0]) == 0


def test_report_names_rank_host_and_signal(tmp_path):
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "rank1.log").write_text("step 3\nKilled\n")
    console = Console(record=True, width=200)
    report_failure(console, str(tmp_path), _summary(1, -9, "node2"), 1)
    text = console.export_text()
    assert "rank 1 (host node2, local rank 0) failed (signal 9)" in text and "Killed" in text
    console = Console(record=True, width=200)
    report_failure(console, str(tmp_path), _summary(1, -9, "node2"), 1, node=1)
    assert "rank 1 (node 1, host node2, local rank 0) failed (signal 9)" in console.export_text()


def test_among_silent_deaths_the_earliest_and_not_the_launchers_sigterm_comes_first(tmp_path):
    (tmp_path / "logs").mkdir()

    def entry(rank, code, time):
        return f"[x]:\n  time      : {time}\n  host      : h\n  rank      : {rank} (local_rank: {rank})\n" \
               f"  exitcode  : {code} (pid: 1)\n"

    # srun stopped rank 0 (SIGTERM) in the same second rank 2 was killed by SIGKILL.
    same_second = entry(0, -15, "2026-11-29_10:00:05") + entry(2, -9, "2026-11-29_10:00:05")
    assert failed_ranks(str(tmp_path), same_second)[0] == 2
    # An earlier death comes first, whatever its signal.
    earlier = entry(0, -15, "2026-11-29_10:00:04") + entry(2, -9, "2026-11-29_10:00:05")
    assert failed_ranks(str(tmp_path), earlier)[0] == 0


def _agent_failure(local_rank: int, code: int) -> str:
    return (f"E1129 23:56:37.349000 12061 torch/distributed/elastic/multiprocessing/api.py:1002] failed "
            f"(exitcode: {code}) local_rank: {local_rank} (pid: 12066) of binary: /usr/bin/python3\n")


def test_restart_notice_names_the_killed_rank(tmp_path):
    from llmtrain.launch.supervision.restarts import RestartNotices

    logs = tmp_path / "logs"
    logs.mkdir()
    notices = RestartNotices(str(tmp_path), nnodes=1, max_restarts=2, nproc_per_node=2)
    (logs / "node0.log").write_text(_agent_failure(1, -9))
    assert notices.poll() == ["llmtrain: rank 1 (node 0, local rank 1) failed (signal 9); torchrun restarts the workers "
                              "(restart 1 of 2), which resume from the newest complete checkpoint"]
    # torchrun saw rank 0's error first (it lost its peer in the same poll): rank 1, which recorded nothing, is named.
    (logs / "rank0.status").write_text('{"status": "error", "error": "Connection closed by peer", "restart": 1}')
    with open(logs / "node0.log", "a") as f:
        f.write(_agent_failure(0, 1))
    (notice,) = notices.poll()
    assert notice.startswith("llmtrain: rank 1 (node 0, local rank 1) failed (ended without an error of its own: killed)")
    assert "(restart 2 of 2)" in notice
    # The failure after the last restart ends the job: the launcher's failure report names it, not a notice.
    with open(logs / "node0.log", "a") as f:
        f.write(_agent_failure(1, -9))
    assert notices.poll() == []


def test_a_node_agent_lost_after_every_rank_finished_is_a_warning(tmp_path):
    import time
    from types import SimpleNamespace

    from llmtrain.launch.backends.ssh import SSHBackend

    logs = tmp_path / "logs"
    logs.mkdir()
    since = time.time() - 1
    backend = SimpleNamespace(run_dir=str(tmp_path), hosts=[SimpleNamespace(name="node1"), SimpleNamespace(name="node2")],
                              cfg=SimpleNamespace(cluster=SimpleNamespace(nnodes=2, nproc_per_node=1)),
                              procs=[SimpleNamespace(poll=lambda: 0), SimpleNamespace(poll=lambda: 255)])
    (logs / "rank0.status").write_text('{"status": "ok"}')
    console = Console(record=True, width=200)
    # Rank 1 has not said it finished: the lost agent is a failure, reported as such elsewhere.
    assert SSHBackend._finished_anyway(backend, console, since) is False and console.export_text() == ""
    (logs / "rank1.status").write_text('{"status": "ok"}')
    assert SSHBackend._finished_anyway(backend, console, since) is True
    assert console.export_text() == ("llmtrain: warning: node 1 (host node2) lost its node agent or ssh connection "
                                     "(exit code 255) after every rank finished; the run finished\n")
    # A status left by an earlier launch does not count as finished in this one.
    assert SSHBackend._finished_anyway(backend, Console(record=True), time.time() + 60) is False


ENOSPC_CKPT = "RuntimeError: no space left on device writing checkpoint step 20 at /run/checkpoints/step-0000020.tmp"


def test_a_recorded_storage_error_is_the_verdict_over_a_silent_peer(tmp_path):
    """The same full disk kept rank 1 from writing its traceback and status, then torchrun stopped it (SIGTERM)."""
    from llmtrain.jobs.job_state import _ended

    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "rank0.status").write_text(json.dumps({"status": "error", "error": ENOSPC_CKPT}))
    (logs / "rank2.status").write_text(json.dumps({"status": "error", "error": "RuntimeError: Connection reset"}))
    summary = ("Failures:\n[1]:\n  time      : 2026-11-29_16:00:02\n  host      : vm\n  rank      : 0 (local_rank: 0)\n"
               "  exitcode  : 1 (pid: 12)\n[2]:\n  time      : 2026-11-29_16:00:02\n  host      : vm\n"
               "  rank      : 2 (local_rank: 2)\n  exitcode  : 1 (pid: 14)\n------\nRoot Cause (first observed "
               "failure):\n[0]:\n  time      : 2026-11-29_16:00:01\n  host      : vm\n  rank      : 1 (local_rank: 1)\n"
               "  exitcode  : -15 (pid: 13)\n")
    assert failed_ranks(str(tmp_path), summary) == [0, 1, 2]
    console = Console(record=True, width=300)
    report_failure(console, str(tmp_path), summary, 1)
    assert console.export_text().splitlines()[0].startswith(
        f"llmtrain: rank 0 (host vm, local rank 0) failed (exit code 1): {ENOSPC_CKPT}; last lines of ")
    # llmtrain status gives the same verdict, by the same rule, also when a lower rank recorded another error.
    (logs / "rank0.status").write_text(json.dumps({"status": "error", "error": "RuntimeError: Connection reset"}))
    (logs / "rank2.status").write_text(json.dumps({"status": "error", "error": ENOSPC_CKPT}))
    assert _ended(str(tmp_path), {}, None) == ("failed", f"rank 2 failed: {ENOSPC_CKPT}")
    assert failed_ranks(str(tmp_path), summary)[0] == 2
    # Another node's silent death comes after the node whose rank ran out of space.
    outputs = [_summary(1, -9, "node1"), _summary(2, 1, "node2")]
    assert culprit_node(str(tmp_path), outputs, [1, 1], failure_order=[0, 1]) == 1
    # OSError's own words count too; an error that does not blame the disk leaves the silent rank first.
    (logs / "rank2.status").write_text(json.dumps({"status": "error", "error": "OSError: [Errno 28] No space "
                                                   "left on device: '/run/metrics.jsonl'"}))
    assert failed_ranks(str(tmp_path), summary)[0] == 2
    (logs / "rank2.status").write_text(json.dumps({"status": "error", "error": "RuntimeError: Connection reset"}))
    assert failed_ranks(str(tmp_path), summary)[0] == 1


def test_a_restart_notice_names_the_rank_that_ran_out_of_space(tmp_path):
    from llmtrain.launch.supervision.restarts import RestartNotices

    logs = tmp_path / "logs"
    logs.mkdir()
    notices = RestartNotices(str(tmp_path), nnodes=1, max_restarts=1, nproc_per_node=2)
    (logs / "rank0.status").write_text(json.dumps({"status": "error", "error": ENOSPC_CKPT, "restart": 0}))
    (logs / "node0.log").write_text("E1129 api.py:1002] failed (exitcode: 1) local_rank: 0 (pid: 7) of binary: x\n")
    (notice,) = notices.poll()
    assert notice.startswith("llmtrain: rank 0 (node 0, local rank 0) failed (exit code 1); torchrun restarts"), notice


def test_an_empty_log_is_said_and_the_last_lines_that_exist_are_shown(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "rank1.log").write_text("")  # killed with SIGKILL before it wrote a line
    (logs / "rank1.place").write_text(json.dumps({"rank": 1, "node": 0, "host": "vm", "local_rank": 1}))
    (logs / "node0.log").write_text("torchrun starting\nfailed (exitcode: -9) local_rank: 1 (pid: 13)\n")
    console = Console(record=True, width=300)
    report_failure(console, str(tmp_path), _summary(1, -9, "vm"), 1)
    lines = console.export_text().splitlines()
    assert lines[0] == ("llmtrain: rank 1 (node 0, host vm, local rank 1) failed (signal 9); last lines of "
                        f"{logs / 'rank1.log'}:")
    # Rank 0 has no log: its node agent's stands in.
    assert lines[1:] == [f"  (its log is empty; last lines of its node agent's log, {logs / 'node0.log'}:)",
                         "  torchrun starting", "  failed (exitcode: -9) local_rank: 1 (pid: 13)"]
    (logs / "rank0.log").write_text("step 3 | loss 5.1\nRuntimeError: Connection closed by peer\n")
    console = Console(record=True, width=300)
    report_failure(console, str(tmp_path), _summary(1, -9, "vm"), 1)
    assert console.export_text().splitlines()[1:] == [
        f"  (its log is empty; last lines of rank 0's log, {logs / 'rank0.log'}:)", "  step 3 | loss 5.1",
        "  RuntimeError: Connection closed by peer"]
    # Nothing anywhere: said, not left blank.
    for name in ("rank0.log", "node0.log"):
        (logs / name).write_text("")
    console = Console(record=True, width=300)
    report_failure(console, str(tmp_path), _summary(1, -9, "vm"), 1)
    assert console.export_text().splitlines()[1:] == ["  (its log is empty)"]
