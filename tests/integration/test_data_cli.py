"""`llmtrain data prepare` from the real binary on folders and JSON lines, and launches refused for their data before anything starts."""

from __future__ import annotations

import gzip
import os
import py_compile
import shutil
from pathlib import Path

import pytest
import torch
from conftest import run_cli
from helpers.dataset_cfgs import data_cfg, model_cfg

from llmtrain.data import (
    DataError,
    build_dataset,
    prepare_corpus,
    read_token_meta,
)
from llmtrain.data.tokenfile import check_token_file


def mixed_folder(root: Path) -> dict[str, bytes]:
    """Two text files plus a gzip file, a .pyc and an executable; returns the text files' bytes by name."""
    root.mkdir(parents=True, exist_ok=True)
    texts = {"notes.md": "# Notes\nsome wörds\n".encode(), "sub/code.txt": b"def f():\n    return 1\n"}
    for name, data in texts.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    (root / "archive.tar.gz").write_bytes(gzip.compress(b"compressed text\n" * 50))
    module = root.parent / "module.py"
    module.write_text("VALUE = 42\n\ndef double(x):\n    return 2 * x\n")
    py_compile.compile(str(module), cfile=str(root / "module.pyc"), doraise=True)
    tool = root / "tool"
    with open(shutil.which("true") or "/bin/true", "rb") as f:
        tool.write_bytes(f.read(4096))
    tool.chmod(0o755)
    return texts


def read_bytes_tokens(path: Path) -> bytes:
    num = read_token_meta(str(path))["num_tokens"]
    tokens = torch.from_file(str(path), size=num, dtype=torch.uint16).to(torch.long)
    assert int(tokens.max()) < 256
    return bytes(tokens.tolist())


def test_prepare_skips_binary_and_compressed_files(tmp_path):
    texts = mixed_folder(tmp_path / "in")
    out = tmp_path / "train.bin"
    result = run_cli(["data", "prepare", "--input", str(tmp_path / "in"), "--output", str(out)])
    assert result.returncode == 0, result.stderr
    # Byte-level: documents follow each other with no separator, in sorted path order.
    expected = texts["notes.md"] + texts["sub/code.txt"]
    meta = read_token_meta(str(out))
    assert meta["num_tokens"] == len(expected) and meta["sources"] == 2
    data = read_bytes_tokens(out)
    assert data == expected and not data.startswith(b"\x1f\x8b")
    assert "skipped 3 file(s)" in result.stdout
    assert "2 binary" in result.stdout and "module.pyc" in result.stdout and "tool" in result.stdout
    assert "1 compressed" in result.stdout and "archive.tar.gz" in result.stdout


def test_prepare_include_and_exclude(tmp_path):
    texts = mixed_folder(tmp_path / "in")
    out = tmp_path / "md.bin"
    result = run_cli(["data", "prepare", "--input", str(tmp_path / "in"), "--output", str(out), "--include", "*.md"])
    assert result.returncode == 0, result.stderr
    assert read_bytes_tokens(out) == texts["notes.md"]
    assert "skipped" not in result.stdout  # the binaries were never selected

    skipped = []
    meta = prepare_corpus([str(tmp_path / "in")], str(tmp_path / "x.bin"), exclude=["*.md", "*.pyc", "tool"],
                          skipped=skipped)
    assert meta["num_tokens"] == len(texts["sub/code.txt"]) and skipped == [
        (os.path.join(str(tmp_path / "in"), "archive.tar.gz"), "compressed")]
    # An excluded folder is not entered; globs also match the relative path.
    meta = prepare_corpus([str(tmp_path / "in")], str(tmp_path / "y.bin"), include=["sub/*", "*.md"], exclude=["sub"])
    assert meta["num_tokens"] == len(texts["notes.md"])
    with pytest.raises(DataError, match="no files match --include/--exclude"):
        prepare_corpus([str(tmp_path / "in")], str(tmp_path / "z.bin"), include=["*.rst"])
    with pytest.raises(DataError, match="no text file to tokenize") as err:
        prepare_corpus([str(tmp_path / "in")], str(tmp_path / "z.bin"), include=["*.gz", "*.pyc"])
    assert "skipped 2 file(s)" in err.value.message
    assert not (tmp_path / "z.bin").exists()


def test_prepare_jsonl_documents(tmp_path):
    (tmp_path / "a.jsonl").write_text('{"text": "first doc", "id": 1}\n\n{"text": "sécond"}\n')
    (tmp_path / "b.txt").write_text("plain\n")
    out = tmp_path / "j.bin"
    result = run_cli(["data", "prepare", "--input", str(tmp_path / "a.jsonl"), str(tmp_path / "b.txt"),
                      "--output", str(out)])
    assert result.returncode == 0, result.stderr
    assert read_bytes_tokens(out) == "first docsécondplain\n".encode()
    assert read_token_meta(str(out))["sources"] == 2

    (tmp_path / "c.jsonl").write_text('{"body": "custom key"}\n')
    result = run_cli(["data", "prepare", "--input", str(tmp_path / "c.jsonl"), "--output", str(out),
                      "--jsonl-key", "body"])
    assert result.returncode == 0, result.stderr
    assert read_bytes_tokens(out) == b"custom key"


@pytest.mark.parametrize("lines,key", [
    (['{"text": "ok"}', "{not json"], "--input"),
    (['{"text": "ok"}', '{"body": "no text field"}'], "--text-key"),
])
def test_prepare_bad_jsonl_line_is_one_line_naming_file_and_line(tmp_path, lines, key):
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(lines) + "\n")
    result = run_cli(["data", "prepare", "--input", str(bad), "--output", str(tmp_path / "o.bin")], cwd=tmp_path)
    assert result.returncode == 2
    err = result.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"llmtrain: error: {key}: ") and f"{bad}:2:" in err[0]
    assert sorted(os.listdir(tmp_path)) == ["bad.jsonl"]


def byte_file(path: Path, num_tokens: int) -> Path:
    src = path.with_suffix(".txt")
    src.write_bytes(bytes(ord("a") + i % 26 for i in range(num_tokens)))
    prepare_corpus([str(src)], str(path))
    return path


def refused_launch(tmp_path: Path, *overrides: str):
    run_dir = tmp_path / "run"
    result = run_cli(["launch", "data=memmap", f"run.dir={run_dir}", *overrides], cwd=tmp_path, timeout=120)
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert not run_dir.exists()
    return lines[0]


def test_launch_refuses_data_with_a_larger_vocabulary(tmp_path):
    path = byte_file(tmp_path / "bytes.bin", 4000)
    line = refused_launch(tmp_path, f"data.path={path}", "model.vocab_size=100")
    assert line.startswith("llmtrain: error: model.vocab_size: ")
    assert "256" in line and "100" in line and "model.vocab_size=256" in line


def test_launch_refuses_a_file_too_small_for_one_sequence(tmp_path):
    path = byte_file(tmp_path / "tiny.bin", 20)
    line = refused_launch(tmp_path, f"data.path={path}", "model.seq_len=64")
    assert line.startswith("llmtrain: error: data.path: ") and str(path) in line
    assert "20 tokens" in line and "65" in line


def test_launch_refuses_a_dtype_mismatch(tmp_path):
    path = byte_file(tmp_path / "u16.bin", 4000)
    line = refused_launch(tmp_path, f"data.path={path}", "data.dtype=uint32")
    assert line.startswith("llmtrain: error: data.dtype: ") and "uint16" in line and "uint32" in line


def test_validation_split_is_needed_only_when_evaluating(tmp_path):
    # 1000 tokens at val_fraction 0.05: 50 val tokens, short of the 65 one sequence needs.
    path = byte_file(tmp_path / "short_val.bin", 1000)
    args = ["config", "data=memmap", f"data.path={path}", "model.seq_len=64"]
    result = run_cli(args, cwd=tmp_path)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "50 of them for validation" in result.stderr and "data.val_fraction" in result.stderr
    assert run_cli([*args, "train.eval_interval=0"], cwd=tmp_path).returncode == 0
    assert run_cli([*args, "data.val_fraction=0.1"], cwd=tmp_path).returncode == 0
    # The worker's own check (second line of defence) agrees: train fits, val is refused when read.
    ds = build_dataset(data_cfg("memmap", str(path), val_fraction=0.05), model_cfg(seq_len=64), seed=0)
    assert ds.num_samples("train") == (950 - 1) // 64
    with pytest.raises(DataError, match="50 of them for validation"):
        ds.num_samples("val")


def test_token_file_checks_are_shared_and_torch_free(tmp_path):
    path = byte_file(tmp_path / "t.bin", 1000)
    info = check_token_file(str(path), dtype=None, seq_len=8, val_fraction=0.1, model_vocab=256, need_val=True)
    assert (info.dtype, info.num_tokens, info.vocab_size) == ("uint16", 1000, 256)
    with open(path, "ab") as f:
        f.write(b"\x00")  # 2001 bytes: not a whole number of uint16 tokens
    with pytest.raises(DataError, match="2001 bytes") as err:
        check_token_file(str(path), dtype=None, seq_len=8, val_fraction=0.1, model_vocab=256, need_val=True)
    assert err.value.key == "data.path"
    (tmp_path / "t.bin.json").write_text("{broken")
    line = refused_launch(tmp_path, f"data.path={path}")
    assert line.startswith("llmtrain: error: data.path: cannot read meta file")
