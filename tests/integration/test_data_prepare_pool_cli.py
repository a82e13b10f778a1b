"""`llmtrain data prepare` with worker processes from the real binary: a replaced shard folder, the summary in a pipe, a worker's bad line, Ctrl-C, the progress bar on a terminal."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time

import psutil
import pytest
from conftest import run_cli
from helpers.corpus_files import left_over, tokenizer, write_corpus  # noqa: F401  (tokenizer: the fixture)

from llmtrain.data.corpus import prepare_corpus


def test_a_shard_folder_is_replaced_whole_and_other_outputs_are_refused(tmp_path):
    corpus = write_corpus(tmp_path / "in", files=3, words=500)
    folder = tmp_path / "shards"
    prepare_corpus([str(corpus)], str(folder), shard_tokens=1000)
    first = sorted(os.listdir(folder))
    index = prepare_corpus([str(corpus / "doc000.txt")], str(folder), shard_tokens=100_000)
    assert len(first) > 3 and sorted(os.listdir(folder)) == ["index.json", "shard-00000.bin", "shard-00000.bin.json"]
    assert index["sources"] == 1 and left_over(tmp_path) == []
    # The old shards are not read as input when the output folder lies in an input folder.
    index = prepare_corpus([str(tmp_path)], str(folder), shard_tokens=100_000)
    assert index["sources"] == 3 and index["num_tokens"] == sum(p.stat().st_size for p in corpus.iterdir())

    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    result = run_cli(["data", "prepare", "--input", str(corpus), "--output", str(tmp_path / "mine"),
                      "--shard-tokens", "100"])
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith(f"llmtrain: error: --output: {tmp_path / 'mine'} is a folder without a")
    assert os.listdir(tmp_path / "mine") == ["notes.txt"]
    result = run_cli(["data", "prepare", "--input", str(corpus), "--output", str(folder)])
    assert result.returncode == 2
    assert result.stderr == (f"llmtrain: error: --output: {folder} is a folder; without --shard-tokens the output "
                             "is one token file\n")
    result = run_cli(["data", "prepare", "--input", str(corpus), "--output", str(tmp_path / "x"),
                      "--shard-tokens", "0"])
    assert result.returncode == 2
    assert result.stderr == "llmtrain: error: --shard-tokens: must be a positive number of tokens, got 0\n"
    assert left_over(tmp_path) == [] and not (tmp_path / "x").exists()


def test_summary_line_in_a_pipe(tmp_path):
    corpus = write_corpus(tmp_path / "in", files=4, words=1000)
    out = tmp_path / "o.bin"
    result = run_cli(["data", "prepare", "--input", str(corpus), "--output", str(out), "--workers", "2"])
    assert result.returncode == 0 and result.stderr == "", result.stderr  # no progress bar off a terminal
    size = sum(p.stat().st_size for p in corpus.iterdir())
    line = result.stdout.strip()
    assert re.fullmatch(
        rf"wrote {size:,} tokens \(uint16, vocab 256, byte-level\) from 4 file\(s\) to {re.escape(str(out))}:"
        rf"( [\d,]+ documents \(mean [\d,]+ tokens\),)? {size / 1e6:.1f} MB of text in \d+\.\d s "
        rf"\([\d,.]+ MB/s, 2 workers\)", line), line


def test_a_workers_bad_line_stops_the_run_in_one_line_with_nothing_written(tmp_path):
    corpus = write_corpus(tmp_path / "in", files=6, words=2000)
    (corpus / "doc003.jsonl").write_text('{"text": "fine"}\n{"text": oops}\n')
    out = tmp_path / "o.bin"
    result = run_cli(["data", "prepare", "--input", str(corpus), "--output", str(out), "--workers", "3"])
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.startswith(f"llmtrain: error: --input: {corpus / 'doc003.jsonl'}:2: not valid JSON")
    assert result.stdout == "" and os.listdir(tmp_path) == ["in"]


@pytest.mark.slow
def test_ctrl_c_mid_run_with_workers_leaves_nothing(tmp_path, tokenizer):
    corpus = write_corpus(tmp_path / "in", files=48, words=250_000)
    (tmp_path / "o.bin").write_bytes(b"old")
    out_dir = tmp_path
    cmd = [sys.executable, "-m", "llmtrain", "data", "prepare", "--input", str(corpus), "--output",
           str(out_dir / "o.bin"), "--tokenizer", tokenizer, "--workers", "2"]
    # Its own process group, like a shell job: Ctrl-C at a terminal reaches every process in the group.
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    parent = psutil.Process(proc.pid)
    deadline = time.monotonic() + 120
    workers = []
    while time.monotonic() < deadline and proc.poll() is None:
        parts = [d for d in out_dir.iterdir() if d.name.startswith(".o.bin.prepare-") and ".parts-" in d.name]
        if parts and any(parts[0].iterdir()):
            workers = parent.children(recursive=True)
            break
        time.sleep(0.05)
    assert len(workers) == 2, "the run ended before it could be interrupted, or started no workers"
    os.killpg(proc.pid, signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert stderr == f"llmtrain: interrupted: nothing was written ({out_dir / 'o.bin'} and its meta are as they were)\n"
    assert sorted(os.listdir(out_dir)) == ["in", "o.bin", "tokenizer.json"]
    assert (out_dir / "o.bin").read_bytes() == b"old"
    gone, alive = psutil.wait_procs(workers, timeout=10)
    assert alive == []


@pytest.mark.slow
def test_a_prepare_killed_by_sigkill_leaves_temps_the_next_one_removes(tmp_path, tokenizer):
    corpus = write_corpus(tmp_path / "in", files=12, words=200_000)
    out = tmp_path / "out" / "o.bin"
    cmd = [sys.executable, "-m", "llmtrain", "data", "prepare", "--input", str(corpus), "--output", str(out),
           "--tokenizer", tokenizer, "--workers", "2"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:  # killed once tokens were appended
        with contextlib.suppress(OSError):  # the temp token file (whatever its name) holds tokens
            if any(p.stat().st_size for p in out.parent.glob(".o.bin.*.tmp")):
                break
        time.sleep(0.05)
    proc.kill()  # kill -9 of the command: its workers die with it
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL, "the run ended before it could be killed"
    left = sorted(p.name for p in out.parent.iterdir())
    assert len(left) == 2 and not out.exists(), left  # the token file being written, the part files' folder
    size = sum(p.stat().st_size for d in out.parent.iterdir() for p in ([d] if d.is_file() else d.iterdir()))

    # One input file this time: the second prepare is quick.
    result = run_cli(["data", "prepare", "--input", str(corpus / "doc000.txt"), "--output", str(out),
                      "--tokenizer", tokenizer, "--workers", "2"])
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    removed = ", ".join(str(out.parent / name) for name in left)
    assert lines[0] == f"removed leftovers of an interrupted prepare: {removed} ({size / 1e6:,.1f} MB)"
    assert lines[1].startswith(f"wrote {out.stat().st_size // 2:,} tokens") and len(lines) == 2
    assert sorted(p.name for p in out.parent.iterdir()) == ["o.bin", "o.bin.json"]
    single = tmp_path / "single.bin"
    prepare_corpus([str(corpus / "doc000.txt")], str(single), tokenizer=tokenizer)
    assert out.read_bytes() == single.read_bytes()


def test_progress_bar_on_a_terminal(tmp_path):
    import pty

    corpus = write_corpus(tmp_path / "in", files=3, words=1000)
    leader, follower = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "llmtrain", "data", "prepare", "--input", str(corpus),
                             "--output", str(tmp_path / "o.bin")], stdout=subprocess.PIPE, stderr=follower)
    os.close(follower)
    shown = b""
    with contextlib.suppress(OSError):  # EIO once the command has closed the terminal
        while chunk := os.read(leader, 65536):
            shown += chunk
    os.close(leader)
    stdout, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0
    assert b"tokenizing" in shown and b"3/3 files" in shown and re.search(rb"[\d.]+ [kM]B/s", shown), shown
    assert stdout.decode().startswith("wrote ")
