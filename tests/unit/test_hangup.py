"""SIGHUP (the launcher's terminal closed), in-process: handled like a preemption but said and exited as a hangup
(129), and output into the closed terminal discarded instead of ending the launcher with a traceback."""

from __future__ import annotations

import json
import os
import signal

import pytest
from rich.console import Console

from llmtrain.closed_stdout import QuietWhenClosed
from llmtrain.errors import EXIT_HANGUP, EXIT_PREEMPTED
from llmtrain.launch import run
from llmtrain.launch.run import PreemptRequest


@pytest.fixture
def handlers():
    """The signal handlers as they were: the code under test installs its own."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGHUP)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def test_a_closed_terminal_is_a_reader_gone_not_an_error():
    master, slave = os.openpty()
    os.close(master)  # the terminal window closed: every write to it fails with EIO
    stream = os.fdopen(slave, "w", buffering=1)
    with pytest.raises(OSError):
        stream.write("x\n")
    quiet = QuietWhenClosed(stream)
    assert quiet.write("llmtrain: hangup (terminal closed): ...\n") == 40
    quiet.flush()
    assert quiet.reader_gone and quiet.write("more\n") == 5
    stream.close()


def test_sighup_exits_129_and_the_others_143():
    assert PreemptRequest("SIGHUP").exit_code == EXIT_HANGUP == 129
    assert PreemptRequest("SIGTERM").exit_code == PreemptRequest("SIGUSR1").exit_code == EXIT_PREEMPTED


def test_the_hangup_line_names_the_checkpointed_step(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    for rank in (0, 1):
        (logs / f"rank{rank}.status").write_text(json.dumps({"status": "preempted", "step": 7, "saved": True}))
    console = Console(record=True, width=300)
    run._report_preempted(console, str(tmp_path), 0, hangup=True)
    assert console.export_text() == "llmtrain: hangup (terminal closed): checkpointed at step 7; the same command " \
                                    "resumes\n"
    (logs / "rank1.status").write_text(json.dumps({"status": "error", "error": "RuntimeError: x"}))  # no save
    run._report_preempted(console, str(tmp_path), 0, hangup=True)
    assert console.export_text() == ("llmtrain: hangup (terminal closed): the job did not confirm a checkpoint (see "
                                     "logs/); the same command resumes from the newest complete checkpoint\n")


def test_a_hangup_before_the_job_started_stops_there_with_129(monkeypatch, capsys, handlers):
    from llmtrain import cli
    from llmtrain.launch.supervision import processes

    # The stop kills what the launcher started: here that would be this test process's own children.
    monkeypatch.setattr(processes, "kill_all", lambda run_dir=None: 0)
    assert cli._main_with_signals([signal.SIGHUP]) == EXIT_HANGUP
    assert capsys.readouterr().out == "llmtrain: SIGHUP: stopped before any worker started\n"
    # From then on the launcher answers SIGHUP as it answers SIGTERM.
    assert signal.getsignal(signal.SIGHUP) == signal.getsignal(signal.SIGTERM)
