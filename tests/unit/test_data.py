"""Data package: datasets, the layout-independent sample stream, and token-file preparation."""

import argparse
import json
import os
import signal
from pathlib import Path

import pytest
import torch
from helpers.dataset_cfgs import SEQ_LEN, data_cfg, model_cfg

from llmtrain.cli import main
from llmtrain.data import (
    DataError,
    SampleStream,
    batch_indices,
    build_dataset,
    ensure_stdlib_corpus,
    get_batch,
    prepare_corpus,
    read_token_meta,
)
from llmtrain.data import atomic_files, encoders
from llmtrain.data.datasets import MemmapDataset, SyntheticDataset
from llmtrain.data.prepare_cli import add_prepare_arguments, run_prepare


def write_tokens(path, tokens, dtype=torch.uint16):
    """A raw token file plus nothing else (no meta), as an external tool would write it."""
    path.write_bytes(bytes(torch.tensor(tokens, dtype=torch.int64).to(dtype).view(torch.uint8).tolist()))
    return str(path)


def memmap_with_windows(tmp_path, train_windows, val_windows, seq_len=SEQ_LEN, name="windows.bin"):
    """A memmap dataset whose train window k starts with token k (easy to identify), uint16."""
    train = [k for k in range(train_windows) for _ in range(seq_len)] + [0]
    val = [1000 + k for k in range(val_windows) for _ in range(seq_len)] + [0]
    total = len(train) + len(val)
    fraction = (len(val) + 0.5) / total  # int(total * fraction) == len(val), free of float rounding
    path = write_tokens(tmp_path / name, train + val)
    ds = MemmapDataset(path, "uint16", seq_len, fraction)
    assert ds.num_samples("train") == train_windows
    assert ds.num_samples("val") == val_windows
    return ds


def window_ids(x):
    return x[:, 0].tolist()


# ---------------------------------------------------------------- synthetic


def test_synthetic_is_a_pure_function_of_seed_split_index():
    ds = SyntheticDataset(seq_len=32, vocab_size=97, seed=3)
    a = ds.sample("train", 12345)
    assert a.shape == (33,) and a.dtype == torch.long
    assert torch.equal(a, ds.sample("train", 12345))
    assert torch.equal(a, SyntheticDataset(32, 97, 3).sample("train", 12345))
    assert not torch.equal(a, ds.sample("train", 12346))
    assert not torch.equal(a, ds.sample("val", 12345 % 1024))
    assert not torch.equal(a, SyntheticDataset(32, 97, 4).sample("train", 12345))
    samples = torch.stack([ds.sample("train", i) for i in range(200)])
    assert int(samples.min()) >= 0 and int(samples.max()) < 97
    assert len({tuple(s.tolist()) for s in samples}) >= 190  # only start*stride collisions allowed
    assert ds.num_samples("train") == 2**31 - 1 and ds.num_samples("val") == 1024


def test_synthetic_is_learnable_constant_stride():
    ds = SyntheticDataset(seq_len=16, vocab_size=50, seed=0)
    for i in range(20):
        diffs = (ds.sample("train", i).diff() % 50).unique()
        assert len(diffs) == 1 and int(diffs) != 0


# ---------------------------------------------------------------- global sample stream


@pytest.mark.parametrize("dp_size", [1, 2, 4])
@pytest.mark.parametrize("accum", [1, 2])
def test_batch_indices_partition_each_step(dp_size, accum):
    mb = 3
    g = mb * dp_size * accum
    for step in (0, 1, 7):
        per_rank = {r: [] for r in range(dp_size)}
        for m in range(accum):
            for r in range(dp_size):
                idx = batch_indices(step, m, r, dp_size, mb, g)
                assert len(idx) == mb
                per_rank[r] += idx
        seen = sorted(i for idx in per_rank.values() for i in idx)
        assert seen == list(range(step * g, (step + 1) * g))
        for r in range(dp_size):
            for other in range(r + 1, dp_size):
                assert not set(per_rank[r]) & set(per_rank[other])


def test_batch_indices_rejects_bad_layouts():
    with pytest.raises(ValueError, match="not a multiple"):
        batch_indices(0, 0, 0, 2, 3, 8)
    with pytest.raises(ValueError, match="micro_step"):
        batch_indices(0, 2, 0, 2, 2, 8)
    with pytest.raises(ValueError, match="dp_rank"):
        batch_indices(0, 0, 2, 2, 2, 8)


def one_epoch(ds, seed, epoch, dp_size, mb, g):
    """Window ids of one epoch's steps (N must be divisible by g) gathered from all ranks."""
    steps_per_epoch = ds.num_samples("train") // g
    ids = []
    for step in range(epoch * steps_per_epoch, (epoch + 1) * steps_per_epoch):
        for m in range(g // (mb * dp_size)):
            for r in range(dp_size):
                x, y = get_batch(ds, "train", step, m, r, dp_size, mb, g, seed)
                assert x.shape == y.shape == (mb, SEQ_LEN)
                ids += window_ids(x)
    return ids


def test_train_order_is_a_seeded_permutation_per_epoch(tmp_path):
    ds = memmap_with_windows(tmp_path, train_windows=37, val_windows=3)
    # G = 37 (prime) with mb=1, dp=1: one epoch = 37 steps.
    epoch0 = one_epoch(ds, seed=5, epoch=0, dp_size=1, mb=1, g=1)
    epoch1 = one_epoch(ds, seed=5, epoch=1, dp_size=1, mb=1, g=1)
    assert sorted(epoch0) == list(range(37))
    assert sorted(epoch1) == list(range(37))
    assert epoch0 != epoch1 and epoch0 != list(range(37))
    # A fresh dataset + stream with the same seed reproduces the order; another seed does not.
    fresh = memmap_with_windows(tmp_path, 37, 3, name="again.bin")
    stream = SampleStream(fresh, seed=5)
    assert [stream.window("train", i) for i in range(74)] == epoch0 + epoch1
    other = SampleStream(fresh, seed=6)
    assert [other.window("train", i) for i in range(37)] != epoch0


def test_every_window_once_per_epoch_across_ranks(tmp_path):
    ds = memmap_with_windows(tmp_path, train_windows=36, val_windows=3)
    for dp_size, mb, g in [(2, 3, 12), (4, 1, 12), (3, 2, 36)]:
        ids = one_epoch(ds, seed=1, epoch=0, dp_size=dp_size, mb=mb, g=g)
        assert sorted(ids) == list(range(36)), (dp_size, mb, g)


def test_dp1_and_dp2_see_the_same_samples_per_step(tmp_path):
    ds = memmap_with_windows(tmp_path, train_windows=37, val_windows=3)
    g = 8
    for step in range(10):  # crosses the epoch boundary at index 37
        x1 = torch.cat([get_batch(ds, "train", step, m, 0, 1, 4, g, seed=2)[0] for m in range(2)])
        x2 = torch.cat([get_batch(ds, "train", step, 0, r, 2, 4, g, seed=2)[0] for r in range(2)])
        # Same order too: dp=1 accum=2 and dp=2 accum=1 read indices in the same sequence.
        assert torch.equal(x1, x2)
        x4 = torch.cat([get_batch(ds, "train", step, m, r, 2, 2, g, seed=2)[0] for m in range(2) for r in range(2)])
        assert torch.equal(x1, x4)


def test_inputs_and_targets_are_shifted_windows(tmp_path):
    tokens = list(range(300))
    ds = MemmapDataset(write_tokens(tmp_path / "r.bin", tokens), "uint16", SEQ_LEN, 0.1)
    assert ds.num_samples("train") == (270 - 1) // SEQ_LEN  # 33
    assert ds.num_samples("val") == (30 - 1) // SEQ_LEN  # 3
    assert ds.sample("train", 2).tolist() == list(range(16, 25))
    assert ds.sample("val", 0).tolist() == list(range(270, 279))
    x, y = get_batch(ds, "val", 1, 0, 0, 1, 2, 2, seed=0)  # val indices 2, 3 -> windows 2, 0
    assert x[:, 0].tolist() == [286, 270]
    assert torch.equal(x[:, 1:], y[:, :-1]) and torch.equal(y[:, -1], x[:, -1] + 1)


# ---------------------------------------------------------------- token files


def test_prepare_bytes_round_trip(tmp_path):
    (tmp_path / "docs" / "sub").mkdir(parents=True)
    a = "héllo, wörld\n".encode()
    b = b"second file\n"
    c = b"third file"
    (tmp_path / "a.txt").write_bytes(a)
    (tmp_path / "docs" / "z.txt").write_bytes(b)
    (tmp_path / "docs" / "sub" / "c.txt").write_bytes(c)  # "sub/c.txt" sorts before "z.txt"
    out = tmp_path / "out" / "train.bin"  # folder does not exist yet

    meta = prepare_corpus([str(tmp_path / "a.txt"), str(tmp_path / "docs")], str(out))
    expected = a + c + b
    assert meta == {
        "format": "llmtrain-tokens-v1",
        "dtype": "uint16",
        "vocab_size": 256,
        "num_tokens": len(expected),
        "tokenizer": "byte",
        "sources": 3,
    }
    assert read_token_meta(str(out)) == meta
    assert json.loads((tmp_path / "out" / "train.bin.json").read_text()) == meta
    assert out.stat().st_size == 2 * len(expected)
    tokens = torch.from_file(str(out), size=len(expected), dtype=torch.uint16).to(torch.long)
    assert bytes(tokens.tolist()) == expected
    assert sorted(os.listdir(tmp_path / "out")) == ["train.bin", "train.bin.json"]


def test_prepare_errors_name_the_flag(tmp_path):
    with pytest.raises(DataError) as err:
        prepare_corpus([str(tmp_path / "missing.txt")], str(tmp_path / "o.bin"))
    assert err.value.key == "--input" and "missing.txt" in str(err.value)
    assert str(err.value).startswith("--input: no such file or directory")
    (tmp_path / "empty.txt").write_bytes(b"")
    with pytest.raises(DataError, match="--input"):
        prepare_corpus([str(tmp_path / "empty.txt")], str(tmp_path / "o.bin"))
    assert sorted(os.listdir(tmp_path)) == ["empty.txt"]  # no output, no temp file


def test_memmap_errors_name_data_path(tmp_path):
    with pytest.raises(DataError) as err:
        MemmapDataset(str(tmp_path / "nope.bin"), "uint16", SEQ_LEN, 0.1)
    assert err.value.key == "data.path" and "no such file" in err.value.message
    odd = tmp_path / "odd.bin"
    odd.write_bytes(b"x" * 1001)
    with pytest.raises(DataError) as err:
        MemmapDataset(str(odd), "uint16", SEQ_LEN, 0.1)
    assert err.value.key == "data.path" and "1001 bytes" in err.value.message
    small = write_tokens(tmp_path / "small.bin", list(range(40)))
    with pytest.raises(DataError) as err:
        MemmapDataset(small, "uint16", SEQ_LEN, 0.1)  # 4 val tokens < 9
    assert err.value.key == "data.path" and "40 tokens" in err.value.message


def test_build_dataset_reads_meta_and_checks_vocab(tmp_path):
    src = tmp_path / "t.txt"
    src.write_text("byte-level text\n" * 40)
    out = str(tmp_path / "t.bin")
    prepare_corpus([str(src)], out)
    ds = build_dataset(data_cfg("memmap", out), model_cfg(), seed=0)
    assert isinstance(ds, MemmapDataset) and ds.vocab_size == 256 and ds.dtype == "uint16"
    with pytest.raises(DataError) as err:
        build_dataset(data_cfg("memmap", out), model_cfg(vocab_size=128), seed=0)
    assert err.value.key == "model.vocab_size"
    with pytest.raises(DataError) as err:
        build_dataset(data_cfg("memmap", out, dtype="uint32"), model_cfg(), seed=0)
    assert err.value.key == "data.dtype"
    with pytest.raises(DataError) as err:
        build_dataset(data_cfg("memmap", str(tmp_path / "x.bin")), model_cfg(), seed=0)
    assert err.value.key == "data.path"
    assert isinstance(build_dataset(data_cfg("synthetic"), model_cfg(), seed=0), SyntheticDataset)


def test_file_without_meta_is_checked_against_model_vocab(tmp_path):
    path = write_tokens(tmp_path / "raw.bin", [5] * 100 + [300] + [5] * 99)
    ds = build_dataset(data_cfg("memmap", path), model_cfg(vocab_size=256), seed=0)
    assert ds.vocab_size is None
    assert ds.sample("train", 0).tolist() == [5] * (SEQ_LEN + 1)
    with pytest.raises(DataError, match="token id 300") as err:
        ds.sample("train", 100 // SEQ_LEN)
    assert err.value.key == "model.vocab_size"


def test_stdlib_corpus_is_exact_deterministic_and_clean(tmp_path):
    first = ensure_stdlib_corpus(str(tmp_path / "a" / "std.bin"), 200_000)
    second = ensure_stdlib_corpus(str(tmp_path / "b" / "std.bin"), 200_000)
    assert os.path.getsize(first) == 2 * 200_000
    with open(first, "rb") as f1, open(second, "rb") as f2:
        data = f1.read()
        assert data == f2.read()
    assert data[1::2] == bytes(200_000)  # high bytes zero: one byte per uint16 token
    assert b"import" in data[0::2]
    meta = read_token_meta(first)
    assert meta["num_tokens"] == 200_000 and meta["vocab_size"] == 256 and meta["dtype"] == "uint16"
    assert sorted(os.listdir(tmp_path / "a")) == ["std.bin", "std.bin.json"]
    # Reused when complete, rebuilt when truncated.
    mtime = os.path.getmtime(first)
    assert ensure_stdlib_corpus(first, 200_000) == first and os.path.getmtime(first) == mtime
    with open(first, "r+b") as f:
        f.truncate(1000)
    ensure_stdlib_corpus(first, 200_000)
    assert os.path.getsize(first) == 2 * 200_000
    ds = build_dataset(data_cfg("stdlib", first, dtype="uint16"), model_cfg(), seed=0)
    assert ds.num_samples("train") == (180_000 - 1) // SEQ_LEN


def test_prepare_cli_summary(tmp_path, capsys):
    (tmp_path / "in.txt").write_text("abc")
    parser = argparse.ArgumentParser()
    add_prepare_arguments(parser)
    args = parser.parse_args(["--input", str(tmp_path / "in.txt"), "--output", str(tmp_path / "o.bin")])
    assert args.tokenizer is None
    assert run_prepare(args) == 0
    line = capsys.readouterr().out.strip()
    assert "3 tokens" in line and "uint16" in line and "vocab 256" in line and "o.bin" in line
    with pytest.raises(SystemExit):
        parser.parse_args(["--output", "x.bin"])  # --input is required


def test_prepare_with_hf_tokenizer(tmp_path):
    try:
        from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    except ImportError:
        pytest.skip("tokenizers not installed: pip install tokenizers")
    docs = ["the cat sat on the mat\n", "the dog sat on the log\nthe end"]
    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(docs, trainers.WordLevelTrainer(special_tokens=["[UNK]", "<|endoftext|>"]))
    tok_path = str(tmp_path / "tokenizer.json")
    tok.save(tok_path)
    for i, doc in enumerate(docs):
        (tmp_path / f"doc{i}.txt").write_text(doc)
    out = str(tmp_path / "tok.bin")

    meta = prepare_corpus([str(tmp_path / "doc0.txt"), str(tmp_path / "doc1.txt")], out, tokenizer=tok_path)
    eot = tok.token_to_id("<|endoftext|>")
    expected = tok.encode(docs[0]).ids + [eot] + tok.encode(docs[1]).ids + [eot]
    assert meta["dtype"] == "uint16" and meta["vocab_size"] == tok.get_vocab_size()
    assert meta["num_tokens"] == len(expected) and meta["tokenizer"] == tok_path and meta["sources"] == 2
    assert torch.from_file(out, size=len(expected), dtype=torch.uint16).tolist() == expected
    with pytest.raises(DataError) as err:
        prepare_corpus([out], str(tmp_path / "x.bin"), tokenizer=str(tmp_path / "missing.json"))
    assert err.value.key == "--tokenizer"

    # .jsonl: each line's text is one document, followed by <|endoftext|> like a whole file.
    jsonl = tmp_path / "docs.jsonl"
    jsonl.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    out = str(tmp_path / "jsonl.bin")
    meta = prepare_corpus([str(jsonl), str(tmp_path / "doc0.txt")], out, tokenizer=tok_path)
    expected = expected + tok.encode(docs[0]).ids + [eot]
    assert meta["num_tokens"] == len(expected) and meta["sources"] == 2
    assert torch.from_file(out, size=len(expected), dtype=torch.uint16).tolist() == expected


def big_vocab_tokenizer(path: Path):
    """A byte-level BPE tokenizer.json with more ids than uint16 holds (about 70,300; Llama 3 has 128,256)."""
    tokenizers = pytest.importorskip("tokenizers", reason="tokenizers not installed: pip install tokenizers")
    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                                             initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["the quick brown fox jumps over the lazy dog"], trainer)
    tok.add_tokens([f"<x{i}>" for i in range(70_000)])
    tok.save(str(path))
    return tok


def test_a_vocabulary_over_65536_is_prepared_as_uint32_and_checked_before_launch(tmp_path, capsys):
    from llmtrain.cli import main

    tok = big_vocab_tokenizer(tmp_path / "tokenizer.json")
    vocab = tok.get_vocab_size(with_added_tokens=True)
    assert vocab > 70_000
    doc = "the fox <x69999> jumps <x5> over the dog\n" * 100
    (tmp_path / "doc.txt").write_text(doc)
    out = tmp_path / "big.bin"
    meta = prepare_corpus([str(tmp_path / "doc.txt")], str(out), tokenizer=str(tmp_path / "tokenizer.json"))
    expected = tok.encode(doc).ids + [tok.token_to_id("<|endoftext|>")]
    assert max(expected) == vocab - 1 >= 2**16  # <x69999>, the last id
    assert (meta["dtype"], meta["vocab_size"], meta["num_tokens"]) == ("uint32", vocab, len(expected))
    assert out.stat().st_size == 4 * len(expected)
    assert torch.from_file(str(out), size=len(expected), dtype=torch.uint32).to(torch.long).tolist() == expected
    # The workers read the ids back whole.
    ds = build_dataset(data_cfg("memmap", str(out)), model_cfg(vocab_size=vocab, seq_len=16), seed=0)
    assert ds.dtype == "uint32" and ds.sample("train", 0).tolist() == expected[:17]

    def config(*overrides: str) -> tuple[int, list[str]]:
        code = main(["config", "data=memmap", f"data.path={out}", "model.seq_len=16", *overrides])
        return code, capsys.readouterr().err.strip().splitlines()

    assert config(f"model.vocab_size={vocab}")[0] == 0
    code, err = config("model.vocab_size=65536")
    assert code == 2 and err == [f"llmtrain: error: model.vocab_size: is 65536 but {out} has vocab_size {vocab}; "
                                 f"set model.vocab_size={vocab} (or larger)"]
    code, err = config(f"model.vocab_size={vocab}", "data.dtype=uint16")
    assert code == 2 and err == [f"llmtrain: error: data.dtype: is uint16 but {out}.json says uint32; "
                                 f"set data.dtype=uint32 (or null)"]
    # A meta that says uint16 for this vocabulary (its ids cannot be in such a file), or none with data.dtype=uint16.
    sidecar = Path(f"{out}.json")
    sidecar.write_text(json.dumps({**meta, "dtype": "uint16", "num_tokens": 2 * len(expected)}))
    code, err = config(f"model.vocab_size={vocab}")
    assert code == 2 and len(err) == 1 and err[0].startswith(
        f"llmtrain: error: data.path: {out} is read as uint16 but {sidecar} says vocab_size {vocab}; uint16 holds "
        f"ids below 65536: prepare it again")
    sidecar.write_text(json.dumps({k: v for k, v in meta.items() if k not in ("dtype", "num_tokens")}))
    code, err = config(f"model.vocab_size={vocab}", "data.dtype=uint16")
    assert code == 2 and len(err) == 1 and err[0].startswith(f"llmtrain: error: data.dtype: {out} is read as uint16")
    assert err[0].endswith("or set data.dtype=uint32")
    assert config(f"model.vocab_size={vocab}", "data.dtype=uint32")[0] == 0


# ---------------------------------------------------------------- data prepare reads text only


def test_prepare_bad_jsonl_line_gives_the_parsers_whole_message(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"text": "ok"}\n{"text": "tab\there"}\n')
    assert main(["data", "prepare", "--input", str(bad), "--output", str(tmp_path / "o.bin")]) == 2
    err = capsys.readouterr().err
    assert err == f"llmtrain: error: --input: {bad}:2: not valid JSON: Invalid control character at column 14\n"


def prepare_args(tmp_path: Path, text: str) -> list[str]:
    (tmp_path / "in.txt").write_text(text)
    return ["data", "prepare", "--input", str(tmp_path / "in.txt"), "--output", str(tmp_path / "o.bin")]


def test_ctrl_c_in_prepare_writes_nothing_and_says_so(tmp_path, capsys, monkeypatch):
    assert main(prepare_args(tmp_path, "old text")) == 0
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}

    def interrupted(self, chunks, out):
        out.write(b"\0" * 64)  # part of the new file is written when Ctrl-C comes
        raise KeyboardInterrupt

    monkeypatch.setattr(encoders.ByteEncoder, "write_file", interrupted)
    assert main(prepare_args(tmp_path, "a much longer new text")) == 130
    err = capsys.readouterr().err
    assert err == (f"llmtrain: interrupted: nothing was written ({tmp_path / 'o.bin'} and its meta are as they "
                   "were)\n"), err
    before["in.txt"] = (tmp_path / "in.txt").read_bytes()
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before  # no temp file left either


def test_ctrl_c_while_prepare_renames_waits_for_the_meta(tmp_path, capsys, monkeypatch):
    """A Ctrl-C between the data file's rename and its meta's would leave new tokens with the old meta."""
    assert main(prepare_args(tmp_path, "old text")) == 0
    renames = []

    def fsync_dir_then_ctrl_c(directory):  # runs right after each rename
        renames.append(directory)
        if len(renames) == 1:
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(atomic_files, "fsync_dir", fsync_dir_then_ctrl_c)
    assert main(prepare_args(tmp_path, "a much longer new text")) == 130
    assert len(renames) == 2, "the meta's rename was cut short"
    meta = json.loads((tmp_path / "o.bin.json").read_text())
    assert meta["num_tokens"] == 22 and (tmp_path / "o.bin").stat().st_size == 44
    assert "o.bin.json were written just before it" in capsys.readouterr().err


# ---------------------------------------------------------------- data checked before launch


