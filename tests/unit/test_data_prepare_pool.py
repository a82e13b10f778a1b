"""`llmtrain data prepare` with worker processes and shard folders: the same bytes for any number of workers, shards
that concatenate to the single file, and Ctrl-C or a worker's error leaving nothing behind."""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from llmtrain.data.corpus import prepare_corpus
from llmtrain.data.tokenfile import inspect_token_file

from conftest import run_cli

WORDS = ["the", "cat", "sat", "on", "mat", "dog", "log", "and", "a", "wörld"]


def write_corpus(folder: Path, files: int, words: int, seed: int = 0) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    for i in range(files):
        text = " ".join(rng.choice(WORDS) for _ in range(words)) + "\n"
        (folder / f"doc{i:03d}.txt").write_text(text, encoding="utf-8")
    return folder


@pytest.fixture
def tokenizer(tmp_path) -> str:
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.train_from_iterator([" ".join(WORDS)], tokenizers.trainers.WordLevelTrainer(
        special_tokens=["[UNK]", "<|endoftext|>"]))
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    return str(path)


def left_over(folder: Path) -> list[str]:
    return sorted(name for name in os.listdir(folder) if name.startswith("."))


@pytest.mark.parametrize("use_tokenizer", [False, True], ids=["byte-level", "tokenizer"])
def test_output_is_the_same_bytes_for_1_2_and_3_workers(tmp_path, tokenizer, use_tokenizer):
    corpus = write_corpus(tmp_path / "in", files=7, words=3000)
    (corpus / "skip.bin").write_bytes(b"\x00\x01binary")  # a skipped unit in the middle of the order
    outputs = {}
    for workers in (1, 2, 3):
        out = tmp_path / f"out{workers}.bin"
        skipped: list = []
        meta = prepare_corpus([str(corpus)], str(out), tokenizer=tokenizer if use_tokenizer else None,
                              workers=workers, skipped=skipped)
        assert meta["sources"] == 7 and skipped == [(str(corpus / "skip.bin"), "binary")]
        assert out.stat().st_size == meta["num_tokens"] * 2
        outputs[workers] = out.read_bytes()
    assert outputs[1] == outputs[2] == outputs[3]
    if not use_tokenizer:
        expected = b"".join((corpus / f"doc{i:03d}.txt").read_bytes() for i in range(7))
        assert outputs[1][0::2] == expected and set(outputs[1][1::2]) == {0}
    assert left_over(tmp_path) == []


def test_shards_have_n_tokens_each_and_concatenate_to_the_single_file(tmp_path, tokenizer):
    corpus = write_corpus(tmp_path / "in", files=5, words=2000)
    single = tmp_path / "one.bin"
    meta = prepare_corpus([str(corpus)], str(single), tokenizer=tokenizer, workers=2)
    total = meta["num_tokens"]
    shard_tokens = 1234
    folder = tmp_path / "shards"
    index = prepare_corpus([str(corpus)], str(folder), tokenizer=tokenizer, workers=2, shard_tokens=shard_tokens)

    count = -(-total // shard_tokens)
    names = [f"shard-{i:05d}.bin" for i in range(count)]
    sizes = [shard_tokens] * (count - 1) + [total - shard_tokens * (count - 1)]
    assert index == json.loads((folder / "index.json").read_text())
    assert index == {
        "format": "llmtrain-shards-v1", "dtype": "uint16", "vocab_size": meta["vocab_size"],
        "tokenizer": os.path.abspath(tokenizer), "num_tokens": total, "documents": index["documents"],
        "sources": 5, "shards": [{"file": n, "num_tokens": s} for n, s in zip(names, sizes)],
    }
    assert sorted(os.listdir(folder)) == sorted(["index.json", *names, *(n + ".json" for n in names)])
    for name, size in zip(names, sizes):
        assert (folder / name).stat().st_size == 2 * size
        shard_meta = json.loads((folder / (name + ".json")).read_text())
        assert shard_meta == {"format": "llmtrain-tokens-v1", "dtype": "uint16", "vocab_size": meta["vocab_size"],
                              "num_tokens": size, "tokenizer": os.path.abspath(tokenizer)}
        assert inspect_token_file(str(folder / name)).num_tokens == size  # each shard is a data=memmap file
    assert b"".join((folder / n).read_bytes() for n in names) == single.read_bytes()
    assert left_over(tmp_path) == []


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
        rf"( [\d,]+ documents \(mean [\d,]+ tokens\),)? {size / 1e6:.1f} MB in \d+\.\d s "
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
        parts = [d for d in out_dir.iterdir() if d.name.startswith(".o.bin.parts-")]
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


@pytest.mark.skipif(sys.platform != "linux", reason="the workers inherit the patch only when forked")
def test_a_worker_killed_mid_run_stops_the_run_with_nothing_written(tmp_path, monkeypatch):
    from llmtrain.data import prepare_pool
    from llmtrain.data.errors import DataError

    corpus = write_corpus(tmp_path / "in", files=6, words=100)
    real = prepare_pool.tokenize_input

    def killed_on_doc002(unit, encoder, out, options):  # runs in the forked worker
        if unit.name.endswith("doc002.txt"):
            os.kill(os.getpid(), signal.SIGKILL)
        return real(unit, encoder, out, options)

    monkeypatch.setattr(prepare_pool, "tokenize_input", killed_on_doc002)
    with pytest.raises(DataError) as err:
        prepare_corpus([str(corpus)], str(tmp_path / "o.bin"), workers=2)
    assert err.value.key == "--workers"
    assert err.value.message == (f"a worker process died (exit code -9) while tokenizing {corpus / 'doc002.txt'}; "
                                 "out of memory? try fewer --workers")
    assert os.listdir(tmp_path) == ["in"]


def test_summary_reports_documents_notes_and_bad_lines(tmp_path, monkeypatch, capsys):
    from llmtrain.cli import main
    from llmtrain.data import prepare_pool, prepare_run

    corpus = write_corpus(tmp_path / "in", files=2, words=10)
    real_tokenize, real_expand = prepare_pool.tokenize_input, prepare_run.expand_inputs

    def counted(unit, encoder, out, options):
        stats = real_tokenize(unit, encoder, out, options)
        stats.documents, stats.bad_lines = 2, 3
        stats.bad_examples = [f"{unit.name}:{n}: not valid JSON" for n in (4, 7, 9)]
        return stats

    monkeypatch.setattr(prepare_pool, "tokenize_input", counted)
    monkeypatch.setattr(prepare_run, "expand_inputs", lambda *a: (real_expand(*a)[0], ["followed 1 symlink"]))
    out = tmp_path / "o.bin"
    assert main(["data", "prepare", "--input", str(corpus), "--output", str(out), "--workers", "1"]) == 0
    tokens = out.stat().st_size // 2
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "followed 1 symlink"
    assert lines[1].startswith(f"wrote {tokens:,} tokens (uint16, vocab 256, byte-level) from 2 file(s) to {out}: "
                               f"4 documents (mean {tokens / 4:.0f} tokens), 0.0 MB in ")
    a = corpus / "doc000.txt"  # the first 3 examples overall
    assert lines[2:] == ["skipped 6 malformed line(s), e.g.:", f"  {a}:4: not valid JSON", f"  {a}:7: not valid JSON",
                         f"  {a}:9: not valid JSON"]


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
    assert b"tokenizing" in shown and b"3/3 files" in shown and b"MB/s" in shown, shown
    assert stdout.decode().startswith("wrote ")


def test_ctrl_c_leaves_a_shard_folder_old_or_new_and_says_which(tmp_path, monkeypatch, capsys):
    from llmtrain.cli import main
    from llmtrain.data import encoders, prepare_output

    corpus = write_corpus(tmp_path / "in", files=2, words=300)
    folder = tmp_path / "shards"
    args = ["data", "prepare", "--input", str(corpus), "--output", str(folder), "--shard-tokens", "500",
            "--workers", "1"]
    assert main(args) == 0
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    capsys.readouterr()

    def interrupted(self, chunks, out):
        out.write(b"\0" * 64)
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(encoders.ByteEncoder, "write_file", interrupted)
        assert main(args[:-4] + ["--shard-tokens", "100", "--workers", "1"]) == 130
    assert capsys.readouterr().err == (f"llmtrain: interrupted: nothing was written ({folder} and its shards are as "
                                       "they were)\n")
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before and left_over(tmp_path) == []

    # A Ctrl-C during the swap waits for it: the new folder is in place, the old one deleted.
    def fsync_dir_then_ctrl_c(directory):  # the parent's fsync comes right after the rename
        if directory == str(tmp_path):
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(prepare_output, "fsync_dir", fsync_dir_then_ctrl_c)
    assert main(args[:-4] + ["--shard-tokens", "100", "--workers", "1"]) == 130
    assert capsys.readouterr().err == f"llmtrain: interrupted: {folder} (a shard folder) was written just before it\n"
    index = json.loads((folder / "index.json").read_text())
    assert {s["num_tokens"] for s in index["shards"][:-1]} == {100} and left_over(tmp_path) == []
