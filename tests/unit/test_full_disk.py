"""A full disk (ENOSPC; a quota, a read-only file system) at each run-directory writer: a metrics row is written whole
or not at all and named with its file, a rank's status still gets written in the room it kept aside, and the
launcher's own records (nodes.json, goodput.json, job.json, the node agent's log) are each one warning line, never
a traceback, with job.json's exit code written if at all possible. `llmtrain status` then says why the job failed."""

from __future__ import annotations

import errno
import json
import os
import socket
import subprocess
import sys
from types import SimpleNamespace

import pytest
from helpers.fake_run import make_run
from helpers.job_records import OK, cli, launch_entry

from llmtrain.errors import StorageError
from llmtrain.launch import launch_record
from llmtrain.launch.launch_record import LaunchRecord
from llmtrain.launch.supervision import processes
from llmtrain.rundir import goodput, job_record, metrics_file, node_ledger, space_reserve
from llmtrain.rundir.metrics_file import append_row, encode_row, read_metrics
from llmtrain.rundir.paths import RunPaths
from llmtrain.train.metrics import MetricsWriter


def full(err: int = errno.ENOSPC) -> OSError:
    return OSError(err, os.strerror(err))


# ---- metrics.jsonl -------------------------------------------------------------------------------------------
def test_a_row_that_does_not_fit_is_cut_back_and_named(tmp_path, monkeypatch):
    path = tmp_path / "metrics.jsonl"
    writer = MetricsWriter(str(path))
    writer.write({"step": 1, "loss": 4.5})
    before = path.read_bytes()
    real_write, calls = os.write, []

    def fills_up(fd, data):  # a full disk writes what fits, then refuses the rest
        calls.append(len(data))
        if len(calls) == 1:
            return real_write(fd, bytes(data[:7]))
        raise full()

    monkeypatch.setattr(metrics_file.os, "write", fills_up)
    with pytest.raises(StorageError) as e:
        writer.write({"step": 2, "loss": 4.25})
    assert str(e.value) == f"no space left on device writing {path}" and e.value.errno == errno.ENOSPC
    assert len(calls) == 2 and calls[1] == calls[0] - 7  # the rest of the row was asked for, not dropped
    assert path.read_bytes() == before  # no half row
    monkeypatch.setattr(metrics_file.os, "write", real_write)
    writer.write({"step": 2, "loss": 4.25})  # room again: the next row follows on a line of its own
    assert [json.loads(line) for line in path.read_text().splitlines()] == [{"step": 1, "loss": 4.5},
                                                                             {"step": 2, "loss": 4.25}]
    writer.close()


@pytest.mark.parametrize("err, words", [(errno.ENOSPC, "no space left on device"),
                                        (errno.EDQUOT, "disk quota exceeded"),
                                        (errno.EROFS, "read-only file system")])
def test_each_storage_error_is_named_in_its_words(tmp_path, monkeypatch, err, words):
    path = tmp_path / "metrics.jsonl"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)

    def refuses(fd, data):
        raise full(err)

    monkeypatch.setattr(metrics_file.os, "write", refuses)
    with pytest.raises(StorageError, match=f"^{words} writing {path}$"):
        append_row(fd, encode_row({"step": 1})[1], str(path))
    os.close(fd)


def test_a_real_full_device_is_named(tmp_path):
    fd = os.open("/dev/full", os.O_WRONLY | os.O_APPEND)  # every write: ENOSPC
    try:
        with pytest.raises(StorageError, match="^no space left on device writing /dev/full$"):
            append_row(fd, encode_row({"step": 1})[1], "/dev/full")
    finally:
        os.close(fd)


def test_a_torn_last_line_of_an_older_writer_is_skipped_by_the_readers(tmp_path, capsys):
    run = make_run(tmp_path, steps=4)
    metrics = run / "metrics.jsonl"
    with open(metrics, "ab") as f:
        f.write(b'{"step": 5, "loss": 3.1, "tok\xc3')  # cut mid-row, mid-character
    assert [r["step"] for r in read_metrics(str(metrics))] == [1, 2, 3, 4, 4]
    code, out, err = cli(capsys, "status", str(run))
    assert code == 0 and "last row    step 4: loss 4.0000" in out and err == ""
    metrics_file.keep_rows_until(str(metrics), 4)  # a resume from step 4 cuts the torn line off
    assert metrics.read_bytes().endswith(b'"val_loss": 3.9}\n')


# ---- a rank's status -----------------------------------------------------------------------------------------
def test_a_rank_status_is_written_in_the_room_it_kept(tmp_path, monkeypatch):
    from llmtrain import worker
    from llmtrain.rundir import rank_files

    run_dir = str(tmp_path)
    os.makedirs(RunPaths(run_dir).logs)
    reserve = RunPaths(run_dir).rank_reserve(0)
    assert space_reserve.hold(reserve) and os.path.getsize(reserve) == space_reserve.RESERVE_BYTES
    real, tries = rank_files.write_status, []

    def full_until_room(*args):  # fails while the reserve still takes the room
        tries.append(os.path.exists(reserve))
        if os.path.exists(reserve):
            raise StorageError(RunPaths(run_dir).rank_status(0), full())
        real(*args)

    monkeypatch.setattr(rank_files, "write_status", full_until_room)
    error = worker.error_words(StorageError(f"{run_dir}/metrics.jsonl", full()))
    worker._write_status(run_dir, 0, "error", error)
    assert tries == [True, False]
    assert rank_files.read_statuses(run_dir)[0]["error"] == f"no space left on device writing {run_dir}/metrics.jsonl"
    assert not os.path.exists(reserve)


def test_a_rank_error_is_said_in_its_words():
    from llmtrain.worker import error_words

    assert error_words(OSError(errno.ENOSPC, "No space left on device", "/r/logs/rank0.progress")) == \
        "no space left on device writing /r/logs/rank0.progress"
    assert error_words(OSError(errno.EROFS, "Read-only file system")) == \
        "read-only file system ([Errno 30] Read-only file system)"
    assert error_words(RuntimeError("Connection reset")) == "RuntimeError: Connection reset"


def test_a_rank_log_on_a_full_disk_is_named(tmp_path):
    from llmtrain.worker import RankLog

    log = RankLog(open("/dev/full", "w", buffering=1), str(tmp_path / "logs" / "rank0.log"))
    with pytest.raises(StorageError, match=f"^no space left on device writing {tmp_path}/logs/rank0.log$"):
        print("step 1", file=log)


# ---- the launcher's records ----------------------------------------------------------------------------------
def test_a_node_ledger_that_cannot_be_written_is_one_warning(tmp_path, monkeypatch, capsys):
    def refuses(path, text):
        raise StorageError(path, full())

    monkeypatch.setattr(node_ledger, "atomic_write_text", refuses)
    ledger = node_ledger.record_node_event(str(tmp_path), "vm", "failure", "rank 0 exited 1")
    assert ledger["hosts"]["vm"]["failure"] == 1  # what it would have written
    assert capsys.readouterr().err == \
        f"llmtrain: warning: could not write {tmp_path}/nodes.json: no space left on device\n"


def test_a_goodput_ledger_that_cannot_be_written_is_one_warning(tmp_path, monkeypatch, capsys):
    def refuses(path, value, **dumps):
        raise StorageError(path, full(errno.EDQUOT))

    monkeypatch.setattr(goodput, "atomic_write_json", refuses)
    goodput.append_entry(str(tmp_path), {"launch": 1})
    assert capsys.readouterr().err == \
        f"llmtrain: warning: could not write {tmp_path}/goodput.json: disk quota exceeded\n"


def _record(tmp_path) -> LaunchRecord:
    os.makedirs(RunPaths(str(tmp_path)).logs, exist_ok=True)
    cfg = SimpleNamespace(run=SimpleNamespace(dir=str(tmp_path)), train=SimpleNamespace(global_batch_size=8))
    return LaunchRecord.start(cfg, SimpleNamespace(name="local", host_names=lambda: [socket.gethostname()]))


def test_the_exit_code_is_written_in_the_room_the_launcher_kept(tmp_path, monkeypatch, capsys):
    record = _record(tmp_path)
    reserve = RunPaths(str(tmp_path)).launcher_reserve
    assert os.path.getsize(reserve) == space_reserve.RESERVE_BYTES
    real = job_record.write_launches

    def full_until_room(run_dir, launches):
        if os.path.exists(reserve):
            raise StorageError(RunPaths(run_dir).job_record, full())
        real(run_dir, launches)

    monkeypatch.setattr(launch_record, "write_launches", full_until_room)
    record.ended(1, None)
    assert job_record.read_launches(str(tmp_path))[-1]["exit_code"] == 1
    assert not os.path.exists(reserve) and capsys.readouterr().err == ""


def test_an_exit_code_that_cannot_be_written_is_said(tmp_path, monkeypatch, capsys):
    record = _record(tmp_path)

    def refuses(run_dir, launches):
        raise StorageError(RunPaths(run_dir).job_record, full(errno.EROFS))

    monkeypatch.setattr(launch_record, "write_launches", refuses)
    record.ended(1, None)
    assert capsys.readouterr().err == (f"llmtrain: warning: could not write {tmp_path}/job.json (this launch's exit "
                                       "code 1): read-only file system\n")
    assert not os.path.exists(RunPaths(str(tmp_path)).launcher_reserve)


def test_a_node_log_on_a_full_disk_still_hands_every_line_on(capfd):
    lines: list[str] = []
    proc = processes.start([sys.executable, "-c", "print('a'); print('b')"], {}, "/dev/full", on_line=lines.append)
    proc.wait(timeout=60)
    for _ in range(100):
        if len(lines) == 2:
            break
        subprocess.run(["sleep", "0.05"])
    assert lines == ["a\n", "b\n"]
    assert capfd.readouterr().err == "llmtrain: warning: could not write /dev/full: no space left on device\n"


# ---- llmtrain status -----------------------------------------------------------------------------------------
def test_status_names_the_rank_that_ran_out_of_space(tmp_path, capsys):
    error = f"no space left on device writing {tmp_path}/run/metrics.jsonl"
    run = make_run(tmp_path, statuses={0: {"status": "error", "error": error, "host": "vm"}, 1: OK},
                   launches=[launch_entry(exit_code=1)])
    code, out, _ = cli(capsys, "status", str(run))
    assert code == 0
    assert f"state       failed: rank 0 failed: {error}\n" in out


def test_status_shows_the_hang_verdict_of_the_launch(tmp_path, capsys):
    verdict = ("llmtrain: hang: rank 1 (node 0, host vm, local rank 1) never entered all_reduce #12 on the dp group; "
               "rank 0 waits in it; rank 1 is sleeping")
    run = make_run(tmp_path, statuses={}, launches=[{**launch_entry(exit_code=1), "hang": verdict}])
    code, out, _ = cli(capsys, "status", str(run))
    assert code == 0
    assert f"state       failed: {verdict.removeprefix('llmtrain: ')}\n" in out
    # A peer's collective timeout after the hang is its consequence: the verdict still comes first.
    (run / "logs" / "rank0.status").write_text(json.dumps({"status": "error", "error": "RuntimeError: timed out"}))
    assert f"state       failed: {verdict.removeprefix('llmtrain: ')}\n" in cli(capsys, "status", str(run))[1]


def test_status_says_a_hangup_stopped_the_job_with_its_checkpoint(tmp_path, capsys):
    stopped = {"status": "preempted", "step": 4, "saved": True}
    run = make_run(tmp_path, statuses={0: stopped, 1: stopped}, launches=[launch_entry(exit_code=129)])
    code, out, _ = cli(capsys, "status", str(run))
    assert code == 0
    assert ("state       hung up: stopped by SIGHUP (its terminal closed; the launcher exited 129); stopped at step "
            "4; checkpoint saved; the same command resumes\n") in out


def test_a_read_only_run_directory_is_said_where_nothing_could_be_recorded(tmp_path, capsys, monkeypatch):
    from rich.console import Console

    from llmtrain.launch.supervision import failures

    run = make_run(tmp_path, statuses={}, launches=[launch_entry(exit_code=None, ended=None)])
    real = os.statvfs
    monkeypatch.setattr(failures.os, "statvfs", lambda path: SimpleNamespace(f_flag=real(path).f_flag | os.ST_RDONLY))
    summary = "Root Cause (first observed failure):\n[0]:\n  rank      : 0 (local_rank: 0)\n  exitcode  : 1 (pid: 12)\n"
    console = Console(record=True, width=400)
    failures.report_failure(console, str(run), summary, 1)
    assert console.export_text().splitlines()[0] == (
        f"llmtrain: rank 0 (local rank 0) failed (exit code 1): read-only file system at {run} (nothing of how it "
        f"ended could be recorded); last lines of {run}/logs/rank0.log:")
    code, out, _ = cli(capsys, "status", str(run))
    assert f"state       failed: read-only file system at {run} (nothing of how it ended could be recorded)\n" in out
