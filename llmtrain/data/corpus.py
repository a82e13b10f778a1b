"""Token files in nanoGPT's .bin format (a flat little-endian uint16/uint32 array) and their
`FILE.json` meta sidecar: the embedded stdlib corpus and `llmtrain data prepare`.

`data prepare` reads text only: a file that is compressed (gzip, zip, bz2, xz, zstd magic
bytes) or binary (a NUL byte, or not valid UTF-8) is skipped and reported, never tokenized.
A `.jsonl` file holds one document per line, in one string field of a JSON object.

Files are written atomically (unique temp file in the target folder, fsync, os.replace), data
first and meta last, so a reader that finds the meta also finds the complete data file, and
ranks or launches that build the same file at once never see a half-written one.
"""

from __future__ import annotations

import codecs
import contextlib
import fnmatch
import json
import os
import re
import sys
import sysconfig
from array import array
from typing import BinaryIO, Iterable, Iterator, Sequence

from .atomic_files import atomic_write as _atomic_write
from .atomic_files import signals_held as _signals_held
from .errors import DataError
from .tokenfile import TOKEN_FORMAT, meta_path, read_token_meta

__all__ = ["TOKEN_FORMAT", "ensure_stdlib_corpus", "meta_path", "prepare_corpus", "read_token_meta"]

EOT_TOKEN = "<|endoftext|>"
BYTE_VOCAB_SIZE = 256
# Read size for streaming byte-level input: bounds memory on multi-GB corpora.
_READ_CHUNK = 1 << 24
_SKIPPED_STDLIB_DIRS = {"site-packages", "dist-packages", "__pycache__"}
# Leading bytes of compressed files: tokenizing them would train on noise.
_COMPRESSED_MAGIC = (b"\x1f\x8b", b"PK\x03\x04", b"PK\x05\x06", b"PK\x07\x08", b"\xfd7zXZ\x00", b"\x28\xb5\x2f\xfd")
_BZIP2_MAGIC = re.compile(rb"BZh[1-9](1AY&SY|\x17rE8P\x90)")  # header + first block (or end-of-stream) magic
# Documents per tokenizer batch for .jsonl input (bounded memory, fast batched encoding).
_ENCODE_BATCH_DOCS = 1024
_ENCODE_BATCH_CHARS = 1 << 24
# Skipped file names listed per reason in the summary.
_LISTED_SKIPS = 3


def ensure_stdlib_corpus(path: str, max_bytes: int) -> str:
    """Build (once) a byte-level corpus of this Python's standard-library sources at `path`.

    All *.py files under sysconfig's stdlib folder (site/dist-packages excluded), sorted by
    relative path, joined with b"\\n" and cut at `max_bytes` tokens: deterministic for a given
    Python install. Returns the absolute path. An existing file is reused when its meta says it
    is complete and was built with the same max_bytes.
    """
    path = os.path.abspath(os.path.expanduser(os.fspath(path)))
    if int(max_bytes) <= 0:
        raise DataError("data.max_bytes", f"must be positive, got {max_bytes}")
    max_bytes = int(max_bytes)
    if _stdlib_corpus_is_ready(path, max_bytes):
        return path
    try:
        return _build_stdlib_corpus(path, max_bytes)
    except OSError as e:  # an unwritable cache (read-only, a file where a folder should be, a full disk)
        where = f"{e.strerror or e}" + (f": {e.filename}" if e.filename else "")
        raise DataError("data.path", f"cannot write the stdlib corpus {path} ({where}); point LLMTRAIN_CACHE "
                                     "(or data.path) at a writable folder") from None


def _build_stdlib_corpus(path: str, max_bytes: int) -> str:
    root = sysconfig.get_paths()["stdlib"]
    sources = _stdlib_sources(root)
    if not sources:
        raise DataError("data.name", f"no .py files under {root} to build the stdlib corpus; use data=memmap")

    remaining, used = max_bytes, 0
    with _atomic_write(path) as out:
        for rel in sources:
            if remaining == 0:
                break
            try:
                with open(os.path.join(root, rel), "rb") as f:
                    content = f.read()
            except OSError:
                continue  # unreadable stdlib file (permissions): leave it out
            piece = (b"\n" + content if used else content)[:remaining]
            out.write(_bytes_as_uint16(piece))
            remaining -= len(piece)
            used += 1
    meta = {
        "format": TOKEN_FORMAT,
        "dtype": "uint16",
        "vocab_size": BYTE_VOCAB_SIZE,
        "num_tokens": max_bytes - remaining,
        "tokenizer": "byte",
        "sources": used,
        "max_bytes": max_bytes,
        "source_root": root,
    }
    _write_meta(path, meta)
    return path


def prepare_corpus(
    inputs: Sequence[str],
    output: str,
    tokenizer: str | None = None,
    *,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    jsonl_key: str = "text",
    skipped: list | None = None,
) -> dict:
    """Tokenize files/directories into one token file `output` plus `output.json`; returns the meta.

    Byte-level by default (one uint16 token per byte, documents concatenated as is). With
    `tokenizer`, a Hugging Face tokenizer.json: each document is encoded whole and followed by
    the <|endoftext|> id when the tokenizer has that token. A document is a whole file, or one
    line of a `.jsonl` file (its `jsonl_key` field).

    Files found in a directory are kept when they match an `include` glob (default: all) and no
    `exclude` glob, tried on the path relative to that directory and on the basename; an excluded
    directory is not entered. Files named directly are always read. Files that are not text are
    skipped; when `skipped` is a list, (name, "binary" | "compressed") pairs are appended to it.
    """
    if isinstance(inputs, (str, os.PathLike)):
        inputs = [inputs]
    tok = _load_tokenizer(tokenizer) if tokenizer is not None else None
    output = os.path.abspath(os.path.expanduser(os.fspath(output)))
    files = _expand_inputs(inputs, {output, meta_path(output)}, list(include), list(exclude))
    encoder = _ByteEncoder() if tok is None else _TokenizerEncoder(tok)
    not_text: list[tuple[str, str]] = []
    total = used = 0
    with contextlib.ExitStack() as commit:
        with _atomic_write(output) as out:
            for path, name in files:
                try:
                    src = open(path, "rb")
                except OSError as e:
                    raise DataError("--input", f"cannot read {name}: {e.strerror or e}") from None
                start = out.tell()
                try:
                    with src:
                        if path.lower().endswith(".jsonl"):
                            total += encoder.write_documents(_jsonl_documents(src, name, jsonl_key), out)
                        else:
                            total += encoder.write_file(_text_chunks(src), out)
                except _NotText as e:
                    out.seek(start)
                    out.truncate()  # drop what was written before the file turned out not to be text
                    not_text.append((name, e.reason))
                    continue
                used += 1
            if used == 0:
                raise DataError("--input", f"no text file to tokenize; {skip_summary(not_text)}")
            if total == 0:
                raise DataError("--input", "the input files are all empty" if tok is None else
                                "the input files produced no tokens")
            # From here a Ctrl-C waits: the data file and its meta replace the old pair together, or neither does.
            commit.enter_context(_signals_held())
        if tok is None:
            meta = _token_meta("uint16", BYTE_VOCAB_SIZE, total, "byte", used)
        else:
            meta = _token_meta(encoder.dtype, encoder.vocab_size, total, os.path.abspath(tokenizer), used)
        _write_meta(output, meta)
    if skipped is not None:
        skipped.extend(not_text)
    return meta


def skip_summary(skipped: Sequence[tuple[str, str]]) -> str:
    """'skipped 3 file(s) that are not text: 2 binary (a.pyc, tool), 1 compressed (b.gz)' from (name, reason)."""
    parts = []
    for reason in ("binary", "compressed"):
        names = [name for name, why in skipped if why == reason]
        if names:
            listed = ", ".join(names[:_LISTED_SKIPS])
            if len(names) > _LISTED_SKIPS:
                listed += f", +{len(names) - _LISTED_SKIPS} more"
            parts.append(f"{len(names)} {reason} ({listed})")
    return f"skipped {len(skipped)} file(s) that are not text: {', '.join(parts)}"


def _stdlib_corpus_is_ready(path: str, max_bytes: int) -> bool:
    if not os.path.isfile(path):
        return False
    try:
        meta = read_token_meta(path)
    except DataError:
        return False  # corrupt sidecar: rebuild
    if meta is None or meta.get("max_bytes", max_bytes) != max_bytes:
        return False
    # A truncated data file (disk full, manual edit) is rebuilt rather than trained on.
    return os.path.getsize(path) == 2 * int(meta.get("num_tokens", -1))


def _stdlib_sources(root: str) -> list[str]:
    """Relative posix paths of the stdlib's .py files, sorted so every machine agrees on order."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in _SKIPPED_STDLIB_DIRS]
        for name in filenames:
            full = os.path.join(dirpath, name)
            if name.endswith(".py") and os.path.isfile(full):
                found.append(os.path.relpath(full, root).replace(os.sep, "/"))
    return sorted(found)


def _expand_inputs(
    inputs: Sequence[str], outputs: set[str], include: list[str], exclude: list[str]
) -> list[tuple[str, str]]:
    """(path, name to show) per file, in command-line order; a directory contributes its matching
    regular files, sorted, recursively. `outputs` (the files being written) are never inputs."""
    if not inputs:
        raise DataError("--input", "no input given")
    files = []
    for given in inputs:
        given = os.fspath(given)
        path = os.path.abspath(os.path.expanduser(given))
        if os.path.isfile(path):
            found = [(path, given)]
        elif os.path.isdir(path):
            found = []
            for dirpath, dirnames, filenames in os.walk(path):
                rel_dir = os.path.relpath(dirpath, path)
                rel_dir = "" if rel_dir == "." else rel_dir.replace(os.sep, "/") + "/"
                dirnames[:] = [d for d in dirnames if not _matches(exclude, rel_dir + d, d)]
                for name in filenames:
                    rel = rel_dir + name
                    if include and not _matches(include, rel, name):
                        continue
                    if _matches(exclude, rel, name):
                        continue
                    full = os.path.join(dirpath, name)
                    if os.path.isfile(full):
                        found.append((full, os.path.join(given, rel)))
            found.sort()
        else:
            raise DataError("--input", f"no such file or directory: {given}")
        files.extend(f for f in found if f[0] not in outputs)
    if not files:
        what = "no files match --include/--exclude" if include or exclude else "no files found"
        raise DataError("--input", f"{what} in: {' '.join(map(str, inputs))}")
    return files


def _matches(patterns: Iterable[str], rel: str, name: str) -> bool:
    return any(fnmatch.fnmatch(rel, p) or fnmatch.fnmatch(name, p) for p in patterns)


class _NotText(Exception):
    """The file being read is not text; `reason` is "binary" or "compressed"."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def _is_compressed(head: bytes) -> bool:
    return head.startswith(_COMPRESSED_MAGIC) or _BZIP2_MAGIC.match(head) is not None


def _text_chunks(src: BinaryIO) -> Iterator[bytes]:
    """The file's bytes in bounded chunks, each checked before it is yielded: raises _NotText at
    compressed magic bytes, a NUL byte or invalid UTF-8 (an incomplete final sequence included)."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    first = True
    while chunk := src.read(_READ_CHUNK):
        if first and _is_compressed(chunk):
            raise _NotText("compressed")
        first = False
        if b"\x00" in chunk:
            raise _NotText("binary")
        # Pure ASCII needs no decoding (unless a multi-byte character straddles the chunk boundary).
        if not (chunk.isascii() and not decoder.getstate()[0]):
            try:
                decoder.decode(chunk)
            except UnicodeDecodeError:
                raise _NotText("binary") from None
        yield chunk
    try:
        decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        raise _NotText("binary") from None


def _jsonl_documents(src: BinaryIO, name: str, key: str) -> Iterator[str]:
    """The `key` string of each line's JSON object (blank lines skipped). Raises _NotText for a file
    that is not text, and a DataError naming file:line for a line that is not such an object."""
    for lineno, raw in enumerate(src, 1):
        if lineno == 1 and _is_compressed(raw):
            raise _NotText("compressed")
        if b"\x00" in raw:
            raise _NotText("binary")
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise _NotText("binary") from None
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as e:
            raise DataError("--input", f"{name}:{lineno}: not valid JSON: {_json_error(e)}") from None
        if not isinstance(obj, dict):
            raise DataError("--input", f"{name}:{lineno}: expected a JSON object, got {type(obj).__name__}")
        if key not in obj:
            raise DataError("--jsonl-key", f"{name}:{lineno}: no {key!r} field; the line has "
                                           f"{', '.join(map(repr, list(obj)[:5])) or 'no fields'}")
        text = obj[key]
        if not isinstance(text, str):
            raise DataError("--jsonl-key", f"{name}:{lineno}: field {key!r} is {type(text).__name__}, not a string")
        yield text


def _json_error(e: ValueError) -> str:
    """The parser's whole message, its position as the column of the line (the line is in FILE:LINE)."""
    if isinstance(e, json.JSONDecodeError):
        return f"{e.msg.removesuffix(' at')} at column {e.colno}"
    return str(e)


def _utf8(text: str) -> bytes:
    # JSON may escape lone surrogates (\ud800), which UTF-8 cannot encode: they become U+FFFD.
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace")


class _ByteEncoder:
    """One uint16 token per byte; documents follow each other with no separator."""

    def write_file(self, chunks: Iterable[bytes], out: BinaryIO) -> int:
        n = 0
        for chunk in chunks:
            out.write(_bytes_as_uint16(chunk))
            n += len(chunk)
        return n

    def write_documents(self, docs: Iterable[str], out: BinaryIO) -> int:
        return self.write_file((_utf8(doc) for doc in docs), out)


class _TokenizerEncoder:
    """A Hugging Face tokenizer; each document is followed by <|endoftext|> when the tokenizer has it."""

    def __init__(self, tok):
        self.tok = tok
        self.vocab_size = tok.get_vocab_size(with_added_tokens=True)
        self.dtype = "uint16" if self.vocab_size < 2**16 else "uint32"
        self.typecode = "H" if self.dtype == "uint16" else _uint32_typecode()
        self.eot_id = tok.token_to_id(EOT_TOKEN)

    def write_file(self, chunks: Iterable[bytes], out: BinaryIO) -> int:
        # A file is one document, encoded whole (the chunks are valid UTF-8 together).
        return self._write([self.tok.encode(b"".join(chunks).decode("utf-8")).ids], out)

    def write_documents(self, docs: Iterable[str], out: BinaryIO) -> int:
        n, batch, chars = 0, [], 0
        for doc in docs:
            batch.append(doc if doc.isascii() else _utf8(doc).decode("utf-8"))
            chars += len(doc)
            if len(batch) >= _ENCODE_BATCH_DOCS or chars >= _ENCODE_BATCH_CHARS:
                n += self._write([e.ids for e in self.tok.encode_batch(batch)], out)
                batch, chars = [], 0
        if batch:
            n += self._write([e.ids for e in self.tok.encode_batch(batch)], out)
        return n

    def _write(self, docs: list[list[int]], out: BinaryIO) -> int:
        tokens = array(self.typecode)
        for ids in docs:
            tokens.extend(ids)
            if self.eot_id is not None:
                tokens.append(self.eot_id)
        if sys.byteorder == "big":
            tokens.byteswap()  # the format is little-endian, like nanoGPT's on x86/ARM
        tokens.tofile(out)
        return len(tokens)


def _load_tokenizer(path: str):
    try:
        from tokenizers import Tokenizer  # optional dependency, only for --tokenizer
    except ImportError:
        raise DataError("--tokenizer", "needs the 'tokenizers' package: pip install tokenizers (or llmtrain[data])") from None
    path = os.path.expanduser(os.fspath(path))
    if not os.path.isfile(path):
        raise DataError("--tokenizer", f"no such file: {path}")
    try:
        return Tokenizer.from_file(path)
    except Exception as e:  # tokenizers raises a bare Exception on malformed JSON
        raise DataError("--tokenizer", f"cannot load {path}: {e}") from None


def _token_meta(dtype: str, vocab_size: int, num_tokens: int, tokenizer: str, sources: int) -> dict:
    return {
        "format": TOKEN_FORMAT,
        "dtype": dtype,
        "vocab_size": vocab_size,
        "num_tokens": num_tokens,
        "tokenizer": tokenizer,
        "sources": sources,
    }


def _uint32_typecode() -> str:
    for code in ("I", "L"):
        if array(code).itemsize == 4:
            return code
    raise RuntimeError("no 4-byte unsigned array typecode on this platform")


def _bytes_as_uint16(data: bytes) -> bytearray:
    """Little-endian uint16 per byte: interleave with zero high bytes (a C-speed slice copy)."""
    out = bytearray(2 * len(data))
    out[0::2] = data
    return out


def _write_meta(path: str, meta: dict) -> None:
    with _atomic_write(meta_path(path)) as out:
        out.write((json.dumps(meta, indent=2) + "\n").encode("utf-8"))
