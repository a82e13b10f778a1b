"""One large jsonl input (plain, gzip, zstd) split among `llmtrain data prepare`'s workers: chunks cut at line ends
by one reader, the same bytes for any number of workers, bad lines named at their line in the file, a file whose
later chunk is not text skipped whole, and the rate in MB of text (decompressed), not of the file's bytes."""

from __future__ import annotations

import gzip
import json
import random
import re

import pytest
from helpers.corpus_files import WORDS, left_over, tokenizer  # noqa: F401  (tokenizer: the fixture)

from llmtrain.cli import main
from llmtrain.data import input_chunks, prepare_run
from llmtrain.data.errors import DataError
from llmtrain.data.prepare_options import PrepareOptions
from llmtrain.data.prepare_run import prepare_tokens

CHUNK = 16 * 1024  # about a dozen chunks for the files below


@pytest.fixture
def chunks_seen(monkeypatch):
    """Small chunks, and the (file, chunk index) of every piece of work handed to the workers, in order."""
    monkeypatch.setattr(input_chunks, "CHUNK_BYTES", CHUNK)
    seen = []
    real = prepare_run.work_units

    def recorded(*args):
        for unit in real(*args):
            seen.append((unit.name, None if unit.chunk is None else unit.chunk.index))
            yield unit

    monkeypatch.setattr(prepare_run, "work_units", recorded)
    return seen


def jsonl_text(lines: int, seed: int = 0, bad: dict[int, str] | None = None) -> bytes:
    """`lines` jsonl lines of random words (line numbers from 1); `bad` replaces some lines."""
    rng = random.Random(seed)
    out = []
    for n in range(1, lines + 1):
        text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 40)))
        out.append((bad or {}).get(n, json.dumps({"text": text, "id": n}, ensure_ascii=False)))
    return ("\n".join(out) + "\n").encode()


def write_input(path, text: bytes):
    if path.name.endswith(".gz"):
        path.write_bytes(gzip.compress(text))
    elif path.name.endswith(".zst"):
        path.write_bytes(pytest.importorskip("zstandard").ZstdCompressor().compress(text))
    else:
        path.write_bytes(text)
    return path


def prepare(inputs, out, workers, **options):
    return prepare_tokens([str(p) for p in inputs], str(out), PrepareOptions(workers=workers, **options))


@pytest.mark.parametrize("name,use_tokenizer", [("big.jsonl.gz", False), ("big.jsonl.gz", True),
                                                ("big.jsonl", False), ("big.jsonl.zst", False)])
def test_one_big_jsonl_is_split_among_workers_with_the_same_bytes(tmp_path, tokenizer, chunks_seen, name,
                                                                  use_tokenizer):
    bad = {57: "not json", 1800: '{"id": 3}', 2950: "[1, 2]"}  # in the first, a middle and the last chunk
    text = jsonl_text(3000, bad=bad)
    big = write_input(tmp_path / name, text)
    outputs = {}
    for workers in (1, 2, 3):
        chunks_seen.clear()
        result = prepare([big], tmp_path / f"out{workers}.bin", workers, on_bad_line="skip",
                         tokenizer=tokenizer if use_tokenizer else None)
        assert result.workers == workers and result.files == 1 and result.documents == 3000 - 3
        assert result.text_bytes == len(text)
        assert result.bad_lines == 3 and [e.split(": ")[0] for e in result.bad_examples] == [
            f"{big}:57", f"{big}:1800", f"{big}:2950"]
        outputs[workers] = ((tmp_path / f"out{workers}.bin").read_bytes(), result.meta)
        if workers == 1:
            assert chunks_seen == [(str(big), None)]  # one worker reads the file in one piece
        else:
            count = -(-len(text) // CHUNK)
            assert chunks_seen == [(str(big), i) for i in range(len(chunks_seen))]
            assert count - 1 <= len(chunks_seen) <= count  # each chunk CHUNK bytes and the rest of its last line
    assert outputs[1] == outputs[2] == outputs[3]
    if not use_tokenizer:
        docs = [json.loads(line)["text"] for line in text.decode().splitlines() if line.startswith("{\"text")]
        assert outputs[1][0][0::2] == "".join(docs).encode()
    assert left_over(tmp_path) == []


def test_a_bad_line_in_a_later_chunk_stops_the_run_naming_its_line(tmp_path, chunks_seen):
    big = write_input(tmp_path / "big.jsonl.gz", jsonl_text(3000, bad={2222: '{"text": oops}'}))
    for workers in (1, 3):
        with pytest.raises(DataError) as err:
            prepare([big], tmp_path / "o.bin", workers)
        assert (err.value.key, err.value.message) == (
            "--input", f"{big}:2222: not valid JSON: Expecting value at column 10")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.jsonl.gz"]


@pytest.mark.parametrize("shard_tokens", [None, 20000])
def test_a_file_whose_later_chunk_is_not_text_is_skipped_whole(tmp_path, chunks_seen, shard_tokens):
    first = write_input(tmp_path / "a.jsonl", jsonl_text(40, seed=1))
    big = write_input(tmp_path / "b.jsonl.gz", jsonl_text(3000, seed=2, bad={2100: '{"text": "nul \x00 byte"}'}))
    last = write_input(tmp_path / "c.jsonl", jsonl_text(40, seed=3))
    outputs = {}
    for workers in (1, 2, 3):
        out = tmp_path / "out" / f"o{workers}"
        result = prepare([first, big, last], out, workers, shard_tokens=shard_tokens)
        assert result.not_text == [(str(big), "binary")] and result.files == 2
        files = sorted(out.iterdir()) if shard_tokens else [out]
        outputs[workers] = [(p.name if shard_tokens else "", p.read_bytes()) for p in files]
    assert max(index for _, index in chunks_seen if index is not None) > 5  # the NUL is far into the file
    assert outputs[1] == outputs[2] == outputs[3]
    expected = b"".join(json.loads(line)["text"].encode() for p in (first, last)
                        for line in p.read_text().splitlines())
    assert b"".join(data for name, data in outputs[3] if name.endswith(".bin") or not name)[0::2] == expected


def test_the_rate_is_in_mb_of_text_not_of_compressed_bytes(tmp_path, chunks_seen, capsys):
    text = jsonl_text(12000)
    big = write_input(tmp_path / "big.jsonl.gz", text)
    assert len(text) > 5 * big.stat().st_size  # so the two figures differ at one decimal
    out = tmp_path / "o.bin"
    assert main(["data", "prepare", "--input", str(big), "--output", str(out), "--workers", "2"]) == 0
    line = capsys.readouterr().out.strip()
    match = re.search(r" ([\d.]+) MB of text in ([\d.]+) s \(([\d.]+) MB/s, 2 workers\)$", line)
    assert match, line
    assert match.group(1) == f"{len(text) / 1e6:.1f}" != f"{big.stat().st_size / 1e6:.1f}"
    megabytes, seconds, rate = map(float, match.groups())
    # The seconds are printed to 0.1 s: the rate is the text's MB over a time within 0.05 s of them (a rate of
    # compressed bytes would be over 5x lower, outside this range for any time printed as 0.1 s or more).
    text_mb = len(text) / 1e6
    assert seconds == 0 or text_mb / (seconds + 0.05) * 0.99 <= rate <= text_mb / max(seconds - 0.05, 1e-9) * 1.01
    assert len(chunks_seen) > 10


def test_which_files_are_split_and_how_many_workers_start():
    from llmtrain.data.input_chunks import pieces, split_units
    from llmtrain.data.prepare_options import InputUnit

    mb = 1 << 20
    units = [InputUnit(f"/d/{n}", n, fmt) for n, fmt in
             (("a.jsonl", "jsonl"), ("b.jsonl.gz", "jsonl.gz"), ("c.txt", "text"), ("d.jsonl", "jsonl"))]
    one_big = [mb, 10 * mb, 64 * mb, mb]  # the text file is one document: never split
    assert split_units(units, one_big, 4, 4 * mb) == [False, True, False, False]
    assert pieces(units, one_big, [False, True, False, False], 4 * mb) == 3 + 10  # 40 MB of text in 4 MB chunks
    alike = [20 * mb, 5 * mb, 20 * mb, 20 * mb]  # none holds more than a worker's share: one file per worker
    assert split_units(units, alike, 4, 4 * mb) == [False] * 4
    assert split_units(units, [mb, mb // 8, 0, 0], 2, 4 * mb) == [False] * 4  # under one chunk of text
    assert split_units(units, one_big, 1, 4 * mb) == [False] * 4  # one worker reads each file whole
