"""`llmtrain data prepare` on the formats corpora come in (jsonl plain/gzip/zstd, parquet, datasets folders), with
--text-key, --encoding, --on-bad-line, symlinks, and end-of-document tokens. In-process: the exact tokens written."""

from __future__ import annotations

import gzip
import io
import json
import os
import sys
from pathlib import Path

import pytest

from llmtrain.cli import main
from llmtrain.data import DataError, prepare_corpus, read_token_meta
from llmtrain.data.encoders import ByteEncoder
from llmtrain.data.inputs import expand_inputs
from llmtrain.data.prepare_options import InputUnit, PrepareOptions
from llmtrain.data.readers import tokenize_input

DOCS = ["first doc", "sécond doc", "third"]


def tokens(path: Path) -> list[int]:
    meta = read_token_meta(str(path))
    width = 2 if meta["dtype"] == "uint16" else 4
    data = path.read_bytes()
    assert len(data) == width * meta["num_tokens"]
    return [int.from_bytes(data[i:i + width], "little") for i in range(0, len(data), width)]


def byte_tokens(path: Path) -> bytes:
    return bytes(tokens(path))


def jsonl_bytes(docs, key="text") -> bytes:
    return "".join(json.dumps({key: d, "id": i}) + "\n" for i, d in enumerate(docs)).encode()


def prepare(tmp_path: Path, *args: str, capsys=None) -> tuple[int, list[str], list[str]]:
    code = main(["data", "prepare", "--output", str(tmp_path / "o.bin"), *args])
    out, err = capsys.readouterr() if capsys else ("", "")
    return code, out.splitlines(), err.splitlines()


def tokenize(path: Path, fmt: str, **options) -> tuple[bytes, object]:
    out = io.BytesIO()
    stats = tokenize_input(InputUnit(str(path), path.name, fmt), ByteEncoder(options.pop("separator", None)), out,
                           PrepareOptions(**options))
    return bytes(out.getvalue()[0::2]), stats


# ---------------------------------------------------------------- formats


def test_compressed_jsonl_and_text_are_read_not_skipped(tmp_path):
    zstd = pytest.importorskip("zstandard")
    (tmp_path / "a.jsonl.gz").write_bytes(gzip.compress(jsonl_bytes(DOCS[:2])))
    (tmp_path / "b.json.gz").write_bytes(gzip.compress(jsonl_bytes(DOCS[2:])))
    (tmp_path / "c.jsonl.zst").write_bytes(zstd.ZstdCompressor().compress(jsonl_bytes(DOCS)))
    (tmp_path / "d.txt.gz").write_bytes(gzip.compress("gzipped text|".encode()))
    (tmp_path / "e.txt.zst").write_bytes(zstd.ZstdCompressor().compress(b"zstd text|"))
    (tmp_path / "f.tar.gz").write_bytes(gzip.compress(b"other compressed files stay skipped"))
    (tmp_path / "g.txt.gz").write_bytes(gzip.compress(b"\x00\x01 binary inside"))
    skipped = []
    meta = prepare_corpus([str(tmp_path)], str(tmp_path / "o.bin"), skipped=skipped)
    assert byte_tokens(tmp_path / "o.bin") == ("".join(DOCS + DOCS) + "gzipped text|zstd text|").encode()
    assert meta["sources"] == 5
    assert skipped == [(str(tmp_path / "f.tar.gz"), "compressed"), (str(tmp_path / "g.txt.gz"), "binary")]


def test_zstd_without_zstandard_is_one_line_naming_the_file(tmp_path, capsys, monkeypatch):
    path = tmp_path / "c.jsonl.zst"
    path.write_bytes(b"(\xb5/\xfd not really")
    monkeypatch.setitem(sys.modules, "zstandard", None)  # import fails as if not installed
    code, out, err = prepare(tmp_path, "--input", str(path), capsys=capsys)
    assert code == 2 and err == [f"llmtrain: error: --input: {path}: reading .zst needs the 'zstandard' package: "
                                 "pip install zstandard (or llmtrain[zstd])"]
    assert sorted(os.listdir(tmp_path)) == ["c.jsonl.zst"]


def test_a_truncated_stream_is_an_error_naming_the_file(tmp_path, capsys):
    zstd = pytest.importorskip("zstandard")
    for name, data, message in (
        ("a.jsonl.gz", gzip.compress(jsonl_bytes(DOCS)), "not a valid gzip stream: Compressed file ended before the "
                                                         "end-of-stream marker was reached"),
        ("a.jsonl.zst", zstd.ZstdCompressor().compress(jsonl_bytes(DOCS)), "not a valid zstd stream: the stream "
                                                                           "ends inside a frame"),
    ):
        path = tmp_path / name
        path.write_bytes(data[:-5])
        code, _, err = prepare(tmp_path, "--input", str(path), capsys=capsys)
        assert code == 2 and err == [f"llmtrain: error: --input: cannot read {path}: {message}"]
        assert not (tmp_path / "o.bin").exists()
    # Frames one after another (zstd -c a b > ab.zst) are all read.
    path.write_bytes(zstd.ZstdCompressor().compress(jsonl_bytes(DOCS[:1])) * 2)
    assert prepare(tmp_path, "--input", str(path), capsys=capsys)[0] == 0
    assert byte_tokens(tmp_path / "o.bin") == (DOCS[0] * 2).encode()


def test_parquet_without_pyarrow_is_one_line_naming_the_file(tmp_path, capsys, monkeypatch):
    path = tmp_path / "t.parquet"
    path.write_bytes(b"PAR1")
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    code, _, err = prepare(tmp_path, "--input", str(path), capsys=capsys)
    assert code == 2 and err == [f"llmtrain: error: --input: {path}: reading it needs the 'pyarrow' package: "
                                 "pip install pyarrow (or llmtrain[formats])"]


def test_parquet_text_column_in_record_batches(tmp_path, capsys, monkeypatch):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    from llmtrain.data import table_input

    docs = [f"row {i} é" for i in range(25)]
    pq.write_table(pa.table({"id": list(range(25)), "body": docs}), tmp_path / "t.parquet", row_group_size=10)
    monkeypatch.setattr(table_input, "ROWS_PER_BATCH", 4)
    code, out, _ = prepare(tmp_path, "--input", str(tmp_path / "t.parquet"), "--text-key", "body", "--separator",
                           "\\n", capsys=capsys)
    assert code == 0 and byte_tokens(tmp_path / "o.bin") == "".join(d + "\n" for d in docs).encode()
    # A missing column: one line naming the file and the columns it has.
    code, _, err = prepare(tmp_path, "--input", str(tmp_path / "t.parquet"), capsys=capsys)
    assert code == 2 and err == [f"llmtrain: error: --text-key: {tmp_path / 't.parquet'} has no column 'text'; "
                                 "its columns: 'id', 'body'"]
    code, _, err = prepare(tmp_path, "--input", str(tmp_path / "t.parquet"), "--text-key", "id", capsys=capsys)
    assert code == 2 and err == [f"llmtrain: error: --text-key: {tmp_path / 't.parquet'}: column 'id' holds int64, "
                                 "not strings"]


def test_a_loose_arrow_file_in_either_layout(tmp_path):
    pa = pytest.importorskip("pyarrow")
    table = pa.table({"text": ["a", "b", "c"]})
    with pa.ipc.new_file(str(tmp_path / "f.arrow"), table.schema) as writer:
        writer.write_table(table, max_chunksize=2)
    with pa.ipc.new_stream(str(tmp_path / "s.arrow"), table.schema) as writer:
        writer.write_table(table, max_chunksize=2)
    meta = prepare_corpus([str(tmp_path / "f.arrow"), str(tmp_path / "s.arrow")], str(tmp_path / "o.bin"))
    assert byte_tokens(tmp_path / "o.bin") == b"abcabc" and meta["sources"] == 2


def test_datasets_folders_read_with_pyarrow_in_their_own_order(tmp_path, capsys):
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_dict({"text": ["b-one", "b-two"]}).save_to_disk(str(tmp_path / "in" / "ds"))
    datasets.DatasetDict({
        "validation": datasets.Dataset.from_dict({"text": ["val"], "n": [1]}),
        "train": datasets.Dataset.from_dict({"text": ["tr1", "tr2"], "n": [2, 3]}),
    }).save_to_disk(str(tmp_path / "in" / "dd"))
    (tmp_path / "in" / "a.txt").write_text("a|")
    capsys.readouterr()
    code, out, _ = prepare(tmp_path, "--input", str(tmp_path / "in"), capsys=capsys)
    assert code == 0
    # Sorted like files (a.txt, dd/, ds/); within dd the splits in dataset_dict.json's order, not sorted.
    assert byte_tokens(tmp_path / "o.bin") == b"a|" + b"valtr1tr2" + b"b-oneb-two"
    assert read_token_meta(str(tmp_path / "o.bin"))["sources"] == 4
    dd = os.path.join(str(tmp_path / "in"), "dd/")
    assert (f"{dd}: a datasets DatasetDict; its splits are read in the order dataset_dict.json lists them: "
            "validation, train") in out
    units, _ = expand_inputs([str(tmp_path / "in" / "dd")], set(), (), ())
    assert [(u.name, u.format) for u in units] == [
        (os.path.join(str(tmp_path / "in" / "dd"), split, "data-00000-of-00001.arrow"), "arrow")
        for split in ("validation", "train")]


# ---------------------------------------------------------------- --text-key, --encoding, --on-bad-line


def test_text_key_and_its_older_name_jsonl_key(tmp_path, capsys):
    (tmp_path / "c.jsonl").write_bytes(jsonl_bytes(DOCS, key="body"))
    for flag in ("--text-key", "--jsonl-key"):
        code, _, _ = prepare(tmp_path, "--input", str(tmp_path / "c.jsonl"), flag, "body", capsys=capsys)
        assert code == 0 and byte_tokens(tmp_path / "o.bin") == "".join(DOCS).encode()


def test_encoding_decodes_legacy_text_into_utf8(tmp_path, capsys):
    (tmp_path / "a.txt").write_bytes("café naïve".encode("latin-1"))
    (tmp_path / "b.jsonl").write_bytes(json.dumps({"text": "ü"}, ensure_ascii=False).encode("latin-1") + b"\n")
    code, _, _ = prepare(tmp_path, "--input", str(tmp_path / "a.txt"), str(tmp_path / "b.jsonl"),
                         "--encoding", "latin-1", capsys=capsys)
    assert code == 0 and byte_tokens(tmp_path / "o.bin") == "café naïveü".encode("utf-8")
    # The same bytes read as UTF-8 are not text; in ASCII neither: skipped and named.
    (tmp_path / "c.txt").write_text("plain")
    code, out, _ = prepare(tmp_path, "--input", str(tmp_path / "a.txt"), str(tmp_path / "c.txt"),
                           "--encoding", "ascii", capsys=capsys)
    assert code == 0 and byte_tokens(tmp_path / "o.bin") == b"plain"
    assert out[-1] == f"skipped 1 file(s) that are not text: 1 binary ({tmp_path / 'a.txt'})"
    # UTF-16 text is full of NUL bytes, yet text once decoded.
    (tmp_path / "d.txt").write_bytes("wide".encode("utf-16"))
    assert tokenize(tmp_path / "d.txt", "text", encoding="utf-16")[0] == b"wide"
    code, _, err = prepare(tmp_path, "--input", str(tmp_path / "c.txt"), "--encoding", "klingon", capsys=capsys)
    assert code == 2 and err == ["llmtrain: error: --encoding: unknown encoding 'klingon' (e.g. utf-8, latin-1, "
                                 "cp1252)"]
    assert not (tmp_path / "o.bin").exists() or byte_tokens(tmp_path / "o.bin") == b"plain"  # left as it was


BAD_JSONL = b'{"text": "ok1"}\n{not json\n[1, 2]\n{"body": "x"}\n{"text": 7}\n{"text": null}\n{"text": "ok2"}\n'


def test_on_bad_line_skip_counts_and_names_the_first_three(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(BAD_JSONL)
    data, stats = tokenize(path, "jsonl", on_bad_line="skip")
    assert data == b"ok1ok2" and (stats.documents, stats.bad_lines, stats.tokens) == (2, 5, 6)
    assert stats.bad_examples == [
        "bad.jsonl:2: not valid JSON: Expecting property name enclosed in double quotes at column 2",
        "bad.jsonl:3: expected a JSON object, got list",
        "bad.jsonl:4: no 'text' field; the line has 'body'",
    ]
    with pytest.raises(DataError) as err:
        tokenize(path, "jsonl")  # stop, the default
    assert str(err.value) == ("--input: bad.jsonl:2: not valid JSON: Expecting property name enclosed in double "
                              "quotes at column 2")


def test_on_bad_line_on_the_command_line(tmp_path, capsys):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(BAD_JSONL)
    code, out, _ = prepare(tmp_path, "--input", str(path), "--on-bad-line", "skip", capsys=capsys)
    assert code == 0 and byte_tokens(tmp_path / "o.bin") == b"ok1ok2"
    assert out[-4:] == ["skipped 5 malformed line(s), e.g.:",
                        f"  {path}:2: not valid JSON: Expecting property name enclosed in double quotes at column 2",
                        f"  {path}:3: expected a JSON object, got list",
                        f"  {path}:4: no 'text' field; the line has 'body'"]
    path.write_bytes(b'{"text": "ok"}\n{"text": null}\n')
    code, _, err = prepare(tmp_path, "--input", str(path), capsys=capsys)
    assert code == 2 and err == [f"llmtrain: error: --text-key: {path}:2: field 'text' is null, not a string"]


def test_null_rows_of_a_table_are_bad_lines(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": ["a", None, "b", None]}), tmp_path / "t.parquet")
    data, stats = tokenize(tmp_path / "t.parquet", "parquet", on_bad_line="skip")
    assert data == b"ab" and (stats.documents, stats.bad_lines) == (2, 2)
    assert stats.bad_examples == ["t.parquet:2: column 'text' is null", "t.parquet:4: column 'text' is null"]
    with pytest.raises(DataError, match=r"^--text-key: t.parquet:2: column 'text' is null$"):
        tokenize(tmp_path / "t.parquet", "parquet")


# ---------------------------------------------------------------- symlinks


def test_symlinked_folders_are_followed_loops_are_not(tmp_path, capsys):
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "x.txt").write_text("X")
    (tmp_path / "in" / "sub").mkdir(parents=True)
    (tmp_path / "in" / "a.txt").write_text("A")
    (tmp_path / "in" / "linked").symlink_to(tmp_path / "elsewhere")
    (tmp_path / "in" / "sub" / "up").symlink_to(tmp_path / "in")  # a loop
    (tmp_path / "in" / "again").symlink_to(tmp_path / "elsewhere")  # "again/" sorts before "linked/"
    code, out, _ = prepare(tmp_path, "--input", str(tmp_path / "in"), capsys=capsys)
    assert code == 0 and byte_tokens(tmp_path / "o.bin") == b"AX"
    root = str(tmp_path / "in")
    assert out[:-1] == [f"read once: {os.path.join(root, 'again/')} and {os.path.join(root, 'linked/')} are the "
                       "same folder",
                       f"symlink loop not followed: {os.path.join(root, 'sub/up/')} leads back to {root}"]


def test_a_file_reached_twice_is_read_once(tmp_path, capsys):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "x.txt").write_text("X")
    (tmp_path / "b" / "link.txt").symlink_to(tmp_path / "a" / "x.txt")
    (tmp_path / "b" / "y.txt").write_text("Y")
    code, out, _ = prepare(tmp_path, "--input", str(tmp_path / "a"), str(tmp_path / "b"),
                           str(tmp_path / "a" / "x.txt"), capsys=capsys)
    assert code == 0 and byte_tokens(tmp_path / "o.bin") == b"XY"
    x, link = os.path.join(str(tmp_path / "a"), "x.txt"), os.path.join(str(tmp_path / "b"), "link.txt")
    assert f"read once: {x} and {link} are the same file" in out
    assert f"read once: {x} and {tmp_path / 'a' / 'x.txt'} are the same file" in out


# ---------------------------------------------------------------- end-of-document tokens


def word_tokenizer(path: Path, specials: list[str]) -> object:
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.train_from_iterator(["the cat sat"], tokenizers.trainers.WordLevelTrainer(special_tokens=["[UNK]", *specials]))
    tok.save(str(path))
    return tok


@pytest.mark.parametrize("specials,eot", [
    (["<|endoftext|>"], "<|endoftext|>"),
    (["<|eot_id|>", "<|end_of_text|>"], "<|end_of_text|>"),  # Llama 3: not <|eot_id|>, which ends a chat turn
    (["</s>"], "</s>"),
    (["<eos>"], "<eos>"),
])
def test_every_document_ends_with_the_end_of_text_token(tmp_path, specials, eot):
    tok = word_tokenizer(tmp_path / "tok.json", specials)
    (tmp_path / "a.jsonl").write_bytes(jsonl_bytes(["the cat", "sat"]))
    (tmp_path / "b.txt").write_text("cat")
    prepare_corpus([str(tmp_path / "a.jsonl"), str(tmp_path / "b.txt")], str(tmp_path / "o.bin"),
                   tokenizer=str(tmp_path / "tok.json"))
    e, ids = tok.token_to_id(eot), tok.get_vocab()
    assert tokens(tmp_path / "o.bin") == [ids["the"], ids["cat"], e, ids["sat"], e, ids["cat"], e]


def test_eot_token_option(tmp_path, capsys):
    tok = word_tokenizer(tmp_path / "tok.json", ["<sep>"])
    (tmp_path / "a.txt").write_text("cat sat")
    args = ["--input", str(tmp_path / "a.txt"), "--tokenizer", str(tmp_path / "tok.json")]
    code, _, err = prepare(tmp_path, *args, capsys=capsys)
    assert code == 2 and err == ["llmtrain: error: --eot-token: the tokenizer has none of <|endoftext|>, "
                                 "<|end_of_text|>, </s>, <eos>; name its end-of-text token with --eot-token TOKEN, "
                                 "or write none with --eot-token none"]
    assert not (tmp_path / "o.bin").exists()
    ids = tok.get_vocab()
    assert prepare(tmp_path, *args, "--eot-token", "<sep>", capsys=capsys)[0] == 0
    assert tokens(tmp_path / "o.bin") == [ids["cat"], ids["sat"], ids["<sep>"]]
    assert prepare(tmp_path, *args, "--eot-token", "none", capsys=capsys)[0] == 0
    assert tokens(tmp_path / "o.bin") == [ids["cat"], ids["sat"]]
    code, _, err = prepare(tmp_path, *args, "--eot-token", "<end>", capsys=capsys)
    assert code == 2 and err == ["llmtrain: error: --eot-token: the tokenizer has no token '<end>'"]


def test_byte_level_separator(tmp_path, capsys):
    (tmp_path / "a.jsonl").write_bytes(jsonl_bytes(DOCS[:2]))
    (tmp_path / "b.txt").write_text("plain")
    inputs = ["--input", str(tmp_path / "a.jsonl"), str(tmp_path / "b.txt")]
    for given, byte in (("\\0", b"\0"), ("10", b"\n"), ("0x7c", b"|")):
        assert prepare(tmp_path, *inputs, "--separator", given, capsys=capsys)[0] == 0
        assert byte_tokens(tmp_path / "o.bin") == byte.join(d.encode() for d in [*DOCS[:2], "plain"]) + byte
    assert prepare(tmp_path, *inputs, capsys=capsys)[0] == 0  # default: none, as before
    assert byte_tokens(tmp_path / "o.bin") == "".join([*DOCS[:2], "plain"]).encode()
    code, _, err = prepare(tmp_path, *inputs, "--separator", "256", capsys=capsys)
    assert code == 2 and err == ["llmtrain: error: --separator: expected a byte 0-255, got 256"]
    _, stats = tokenize(tmp_path / "a.jsonl", "jsonl", separator=10)
    assert (stats.documents, stats.tokens) == (2, len("".join(DOCS[:2]).encode()) + 2)
