"""Token files in nanoGPT's .bin format (a flat little-endian uint16/uint32 array) and their
`FILE.json` meta sidecar: the embedded stdlib corpus and `llmtrain data prepare`.

Which files are read is inputs.py's concern, how one input becomes documents readers.py's, and how
documents become tokens encoders.py's; prepare_run.py runs the whole preparation (workers in
prepare_pool.py, the output in prepare_output.py) and `prepare_corpus` is its Python entry point.

Files are written atomically (unique temp file in the target folder, fsync, os.replace), data
first and meta last, so a reader that finds the meta also finds the complete data file, and
ranks or launches that build the same file at once never see a half-written one.
"""

from __future__ import annotations

import os
import sysconfig
from typing import Sequence

from .atomic_files import atomic_write as _atomic_write
from .encoders import BYTE_VOCAB_SIZE, bytes_as_uint16
from .errors import DataError
from .prepare_options import PrepareOptions
from .prepare_output import write_meta as _write_meta
from .prepare_run import prepare_tokens, skip_summary
from .tokenfile import TOKEN_FORMAT, meta_path, read_token_meta

__all__ = ["TOKEN_FORMAT", "ensure_stdlib_corpus", "meta_path", "prepare_corpus", "read_token_meta",
           "skip_summary"]

_SKIPPED_STDLIB_DIRS = {"site-packages", "dist-packages", "__pycache__"}


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
            out.write(bytes_as_uint16(piece))
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
    text_key: str | None = None,
    encoding: str = "utf-8",
    on_bad_line: str = "stop",
    separator: int | None = None,
    eot_token: str | None = None,
    skipped: list | None = None,
    notes: list | None = None,
    workers: int = 1,
    shard_tokens: int | None = None,
) -> dict:
    """Tokenize files/directories into one token file `output` plus `output.json`; returns the meta.

    Byte-level by default (one uint16 token per byte, documents concatenated as is, or each
    followed by the `separator` byte). With `tokenizer`, a Hugging Face tokenizer.json: each
    document is encoded whole and followed by its end-of-text token (`eot_token`, or looked up;
    "none" for none). A document is a whole text file (decoded with `encoding`), or one line of a
    jsonl file / row of a table (its `text_key` field; `jsonl_key` is the older name). A malformed
    line stops with a DataError, or with `on_bad_line="skip"` is skipped and noted.

    Files found in a directory are kept when they match an `include` glob (default: all) and no
    `exclude` glob, tried on the path relative to that directory and on the basename; an excluded
    directory is not entered. Files named directly are always read. Files that are not text are
    skipped; when `skipped` is a list, (name, "binary" | "compressed") pairs are appended to it,
    and when `notes` is a list, lines for the user (files read once, lines skipped) are.

    `workers` processes tokenize the files, a large jsonl file in chunks (the output is the same for
    any number); with `shard_tokens`, `output` is a folder of shards and the returned dict is its
    index.json. Leftovers of an interrupted prepare to `output` are removed first (said in `notes`).
    """
    if isinstance(inputs, (str, os.PathLike)):
        inputs = [inputs]
    options = PrepareOptions(tokenizer=tokenizer, include=tuple(include), exclude=tuple(exclude),
                             text_key=text_key or jsonl_key, encoding=encoding, on_bad_line=on_bad_line,
                             separator=separator, eot_token=eot_token, workers=workers, shard_tokens=shard_tokens)
    result = prepare_tokens(inputs, output, options)
    if skipped is not None:
        skipped.extend(result.not_text)
    if notes is not None:
        notes.extend(result.notes)
        if result.bad_lines:
            notes.append(f"skipped {result.bad_lines:,} malformed line(s), e.g. " + "; ".join(result.bad_examples))
    return result.meta


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


