"""`llmtrain data prepare` with worker processes and shard folders: the same bytes for any number of workers, shards
that concatenate to the single file, and Ctrl-C or a worker's error leaving nothing behind."""

from __future__ import annotations

import json
import os
import signal
import sys

import pytest
from helpers.corpus_files import left_over, tokenizer, write_corpus  # noqa: F401  (tokenizer: the fixture)

from llmtrain.data.corpus import prepare_corpus
from llmtrain.data.tokenfile import inspect_token_file


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
                               f"4 documents (mean {tokens / 4:.0f} tokens), 0.0 MB of text in ")
    a = corpus / "doc000.txt"  # the first 3 examples overall
    assert lines[2:] == ["skipped 6 malformed line(s), e.g.:", f"  {a}:4: not valid JSON", f"  {a}:7: not valid JSON",
                         f"  {a}:9: not valid JSON"]


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
