"""A reader that stops early (`llmtrain status RUN | head -2`) ends a command quietly, with its own exit code."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from helpers.fake_run import make_run


def run_into_closed_pipe(args: list[str]) -> tuple[int, str]:
    """Run `python -m llmtrain ARGS` with stdout a pipe whose reader has already gone (closed before the command
    writes its first byte, so the write is sure to fail); return its exit code and stderr."""
    read_end, write_end = os.pipe()
    proc = subprocess.Popen([sys.executable, "-m", "llmtrain", *args], stdout=write_end, stderr=subprocess.PIPE,
                            text=True)
    os.close(write_end)
    os.close(read_end)
    _, err = proc.communicate(timeout=120)
    return proc.returncode, err


@pytest.mark.parametrize("args, code", [
    (["plan"], 0),                                        # fits: 0, not the 1 that means "does not fit"
    (["plan", "model=gpt-175b", "hardware=t4"], 1),       # does not fit: still 1
    (["plan", "--json"], 0),
    (["config", "model=gpt-125m"], 0),
])
def test_a_closed_pipe_is_quiet_and_keeps_the_exit_code(args, code):
    assert run_into_closed_pipe(args) == (code, "")


def test_status_into_a_closed_pipe_is_quiet(tmp_path):
    run_dir = make_run(tmp_path)
    assert run_into_closed_pipe(["status", str(run_dir)]) == (0, "")
    assert run_into_closed_pipe(["status", str(run_dir), "--json"]) == (0, "")


@pytest.mark.parametrize("command, first_line", [
    (["plan"], "plan"),
    (["config"], "model:"),
    (["status", "RUN"], "run {run_dir} (gpt-tiny)"),
])
def test_a_reader_that_takes_one_line_then_leaves(command, first_line, tmp_path):
    """The usual `| head -1`: the first line arrives, the rest is discarded."""
    run_dir = make_run(tmp_path)
    argv = [str(run_dir) if a == "RUN" else a for a in command]
    proc = subprocess.Popen([sys.executable, "-m", "llmtrain", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    first = proc.stdout.readline()
    proc.stdout.close()
    assert " ".join(first.split()) == first_line.format(run_dir=run_dir)
    assert proc.wait(timeout=120) == 0 and proc.stderr.read() == ""
