"""Token files in nanoGPT's .bin format (a flat little-endian uint16/uint32 array) and their
`FILE.json` meta sidecar: the embedded stdlib corpus and `llmtrain data prepare`.

Which files are read is inputs.py's concern, how one input becomes documents readers.py's, and how
documents become tokens encoders.py's; this module runs the whole preparation and writes the result.

Files are written atomically (unique temp file in the target folder, fsync, os.replace), data
first and meta last, so a reader that finds the meta also finds the complete data file, and
ranks or launches that build the same file at once never see a half-written one.
"""

from __future__ import annotations

import contextlib
import json
import os
import sysconfig
from typing import Sequence

from .atomic_files import atomic_write as _atomic_write
from .atomic_files import signals_held as _signals_held
from .encoders import BYTE_VOCAB_SIZE, ByteEncoder, TokenizerEncoder, bytes_as_uint16, load_tokenizer
from .errors import DataError
from .inputs import expand_inputs
from .prepare_options import PrepareOptions
from .readers import NotText, tokenize_input
from .tokenfile import TOKEN_FORMAT, meta_path, read_token_meta

__all__ = ["TOKEN_FORMAT", "ensure_stdlib_corpus", "meta_path", "prepare_corpus", "read_token_meta"]

_SKIPPED_STDLIB_DIRS = {"site-packages", "dist-packages", "__pycache__"}
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
    """
    if isinstance(inputs, (str, os.PathLike)):
        inputs = [inputs]
    tok = load_tokenizer(tokenizer) if tokenizer is not None else None
    output = os.path.abspath(os.path.expanduser(os.fspath(output)))
    options = PrepareOptions(tokenizer=tokenizer, include=tuple(include), exclude=tuple(exclude),
                             text_key=text_key or jsonl_key, encoding=encoding, on_bad_line=on_bad_line,
                             separator=separator, eot_token=eot_token)
    units, input_notes = expand_inputs(inputs, {output, meta_path(output)}, options.include, options.exclude)
    encoder = ByteEncoder(options.separator) if tok is None else TokenizerEncoder(tok, options.eot_token)
    bad_notes: list[str] = []
    not_text: list[tuple[str, str]] = []
    total = used = 0
    with contextlib.ExitStack() as commit:
        with _atomic_write(output) as out:
            for unit in units:
                try:
                    stats = tokenize_input(unit, encoder, out, options)
                except NotText as e:
                    not_text.append((unit.name, e.reason))
                    continue
                total += stats.tokens
                if stats.bad_lines:
                    bad_notes.append(f"skipped {stats.bad_lines} bad line(s) in {unit.name}, e.g. "
                                     + "; ".join(stats.bad_examples))
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
    if notes is not None:
        notes.extend(input_notes + bad_notes)
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
























def _token_meta(dtype: str, vocab_size: int, num_tokens: int, tokenizer: str, sources: int) -> dict:
    return {
        "format": TOKEN_FORMAT,
        "dtype": dtype,
        "vocab_size": vocab_size,
        "num_tokens": num_tokens,
        "tokenizer": tokenizer,
        "sources": sources,
    }






def _write_meta(path: str, meta: dict) -> None:
    with _atomic_write(meta_path(path)) as out:
        out.write((json.dumps(meta, indent=2) + "\n").encode("utf-8"))
