"""Two ends a launcher must report in words, through real launches: its terminal closing (SIGHUP: the workers
checkpoint, the launcher says so, records exit 129 and the same command resumes) and its run directory's disk
filling up mid-run (one line naming the rank, the file and `no space left on device`; every metrics line whole)."""

from __future__ import annotations

import errno
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, SMALL, run_cli, wait_for, worker_processes
from helpers.job_records import cli

from llmtrain.rundir.metrics_file import read_metrics

RUN = [*SMALL, "data=synthetic", "train.global_batch_size=8", "train.micro_batch_size=2"]

# Makes the pty on fd 2 the controlling terminal of a new session, then runs the command: closing the pty's
# master side then hangs up that terminal, as closing a terminal window does (SIGHUP, and EIO on every write).
IN_A_TERMINAL = ("import fcntl, os, sys, termios; os.setsid(); fcntl.ioctl(2, termios.TIOCSCTTY, 0); "
                 "os.execvp(sys.argv[1], sys.argv[1:])")


def _steps(run_dir: Path) -> list[int]:
    return [r["step"] for r in read_metrics(str(run_dir / "metrics.jsonl")) if "loss" in r]


@pytest.mark.slow
def test_a_closed_terminal_checkpoints_says_so_and_the_same_command_resumes(tmp_path, capsys):
    run_dir = tmp_path / "run"
    command = [sys.executable, "-m", "llmtrain", "launch", f"run.dir={run_dir}", *RUN, "train.max_steps=40"]
    master, slave = os.openpty()
    out_path = tmp_path / "launch.txt"
    with open(out_path, "w") as out:
        proc = subprocess.Popen([sys.executable, "-c", IN_A_TERMINAL, *command], cwd=REPO, stdin=subprocess.DEVNULL,
                                stdout=out, stderr=slave)
    os.close(slave)
    try:
        assert wait_for(lambda: _steps(run_dir), timeout=180), "training never started"
        os.close(master)  # the terminal closes: the launcher gets SIGHUP; its stderr now fails with EIO
        code = proc.wait(timeout=180)
    finally:
        proc.kill()
    said = out_path.read_text()
    assert code == 129, said[-3000:]
    hangup = re.findall(r"^llmtrain: hangup \(terminal closed\): checkpointed at step (\d+); the same command "
                        r"resumes$", said, re.M)
    assert len(hangup) == 1 and "Traceback" not in said, said[-3000:]
    step = int(hangup[0])
    meta = json.loads((run_dir / "checkpoints" / f"step-{step:07d}" / "meta.json").read_text())
    assert meta["complete"] and meta["step"] == step
    launch = json.loads((run_dir / "job.json").read_text())["launches"][-1]
    assert (launch["exit_code"], launch["signal"]) == (129, "SIGHUP") and launch["ended"]
    assert wait_for(lambda: not worker_processes(run_dir), timeout=30), worker_processes(run_dir)
    code, status, _ = cli(capsys, "status", str(run_dir))
    assert code == 0
    assert (f"state       hung up: stopped by SIGHUP (its terminal closed; the launcher exited 129); stopped at "
            f"step {step}; checkpoint saved; the same command resumes\n") in status, status
    # The same command resumes from that checkpoint and finishes the run.
    again = run_cli(command[3:], cwd=REPO)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-2000:]
    assert f"resuming from {run_dir / 'checkpoints' / f'step-{step:07d}'}" in again.stdout
    assert _steps(run_dir) == list(range(1, 41))


@pytest.mark.slow
def test_a_disk_filled_mid_run_is_one_line_naming_the_rank_and_file(tmp_path, capsys):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(run_dir)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"mounting a small tmpfs is not permitted here (needs root): {mounted.stderr.strip()}")
    try:
        proc = subprocess.Popen([sys.executable, "-m", "llmtrain", "launch", f"run.dir={run_dir}", *RUN,
                                 "cluster.nproc_per_node=1", "train.max_steps=100000", "checkpoint.at_end=false"],
                                cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert wait_for(lambda: len(_steps(run_dir)) >= 2, timeout=180), "training never started"
            with open(run_dir / "filler", "wb", buffering=0) as filler:  # fill the disk up to the last byte
                try:
                    while True:
                        filler.write(b"\0" * 4096)
                except OSError as e:
                    assert e.errno == errno.ENOSPC
            out, err = proc.communicate(timeout=180)
        finally:
            proc.kill()
        said = out + err
        assert proc.returncode == 1, said[-3000:]
        failed = [line for line in said.splitlines() if " failed (" in line]
        assert len(failed) == 1, said[-3000:]
        assert re.fullmatch(rf"llmtrain: rank 0 \(node 0, host \S+, local rank 0\) failed \((?:job )?exit code 1\): "
                            rf"no space left on device writing {re.escape(str(run_dir))}/\S+; last lines of "
                            rf"{re.escape(str(run_dir / 'logs' / 'rank0.log'))}:", failed[0]), said[-3000:]
        assert "Traceback" not in said, said[-3000:]
        raw = (run_dir / "metrics.jsonl").read_bytes()
        assert raw.endswith(b"\n") and all(json.loads(line)["step"] for line in raw.splitlines())
        launch = json.loads((run_dir / "job.json").read_text())["launches"][-1]
        assert launch["exit_code"] == 1
        code, status, _ = cli(capsys, "status", str(run_dir))
        reason = failed[0].split(" failed (", 1)[1].split("): ", 1)[1].split("; last lines", 1)[0]
        assert code == 0 and re.search(rf"^state       failed: rank 0 \(.*\) failed: {re.escape(reason)}$", status,
                                       re.M), status
    finally:
        subprocess.run(["umount", "-l", str(run_dir)], capture_output=True)
