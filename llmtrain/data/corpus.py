"""Token files in nanoGPT's .bin format (a flat little-endian uint16/uint32 array) and their
`FILE.json` meta sidecar: the embedded stdlib corpus and `llmtrain data prepare`.

Files are written atomically (unique temp file in the target folder, fsync, os.replace), data
first and meta last, so a reader that finds the meta also finds the complete data file, and
ranks or launches that build the same file at once never see a half-written one.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import sysconfig
import tempfile
from array import array
from typing import BinaryIO, Iterator, Sequence

from .errors import DataError

TOKEN_FORMAT = "llmtrain-tokens-v1"
EOT_TOKEN = "<|endoftext|>"
BYTE_VOCAB_SIZE = 256
# Read size for streaming byte-level input: bounds memory on multi-GB corpora.
_READ_CHUNK = 1 << 24
_SKIPPED_STDLIB_DIRS = {"site-packages", "dist-packages", "__pycache__"}


def meta_path(path: str) -> str:
    """The meta sidecar of a token file: FILE.bin -> FILE.bin.json."""
    return os.fspath(path) + ".json"


def read_token_meta(path: str) -> dict | None:
    """The meta written beside token file `path`, or None when there is none."""
    sidecar = meta_path(path)
    try:
        with open(sidecar, encoding="utf-8") as f:
            meta = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise DataError("data.path", f"cannot read meta file {sidecar}: {e}") from None
    if not isinstance(meta, dict) or meta.get("format") != TOKEN_FORMAT:
        raise DataError("data.path", f"{sidecar} is not a {TOKEN_FORMAT} meta file")
    return meta


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


def prepare_corpus(inputs: Sequence[str], output: str, tokenizer: str | None = None) -> dict:
    """Tokenize files/directories into one token file `output` plus `output.json`; returns the meta.

    Byte-level by default (one uint16 token per byte, files concatenated as is). With `tokenizer`,
    a Hugging Face tokenizer.json: each file is one document, encoded whole, followed by the
    <|endoftext|> id when the tokenizer has that token.
    """
    if isinstance(inputs, (str, os.PathLike)):
        inputs = [inputs]
    output = os.path.abspath(os.path.expanduser(os.fspath(output)))
    files = _expand_inputs(inputs, exclude={output, meta_path(output)})
    if tokenizer is None:
        meta = _write_byte_tokens(files, output)
    else:
        meta = _write_tokenizer_tokens(files, output, tokenizer)
    _write_meta(output, meta)
    return meta


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


def _expand_inputs(inputs: Sequence[str], exclude: set[str]) -> list[str]:
    """Files in command-line order; a directory contributes its regular files, sorted, recursively."""
    if not inputs:
        raise DataError("--input", "no input given")
    files = []
    for given in inputs:
        path = os.path.abspath(os.path.expanduser(os.fspath(given)))
        if os.path.isfile(path):
            found = [path]
        elif os.path.isdir(path):
            found = []
            for dirpath, _, filenames in os.walk(path):
                found.extend(os.path.join(dirpath, name) for name in filenames)
            found = sorted(f for f in found if os.path.isfile(f))
        else:
            raise DataError("--input", f"no such file or directory: {given}")
        files.extend(f for f in found if f not in exclude)
    if not files:
        raise DataError("--input", f"no files found in: {' '.join(map(str, inputs))}")
    return files


def _write_byte_tokens(files: list[str], output: str) -> dict:
    total = 0
    with _atomic_write(output) as out:
        for path in files:
            with open(path, "rb") as src:
                while chunk := src.read(_READ_CHUNK):
                    out.write(_bytes_as_uint16(chunk))
                    total += len(chunk)
        if total == 0:
            raise DataError("--input", "the input files are all empty")
    return _token_meta("uint16", BYTE_VOCAB_SIZE, total, "byte", len(files))


def _write_tokenizer_tokens(files: list[str], output: str, tokenizer_path: str) -> dict:
    tok = _load_tokenizer(tokenizer_path)
    vocab_size = tok.get_vocab_size(with_added_tokens=True)
    dtype = "uint16" if vocab_size < 2**16 else "uint32"
    typecode = "H" if dtype == "uint16" else _uint32_typecode()
    eot_id = tok.token_to_id(EOT_TOKEN)
    total = 0
    with _atomic_write(output) as out:
        for path in files:
            # errors="replace": one bad byte should not stop a large job; the tokenizer needs str.
            with open(path, encoding="utf-8", errors="replace") as src:
                ids = tok.encode(src.read()).ids
            if eot_id is not None:
                ids.append(eot_id)
            tokens = array(typecode, ids)
            if sys.byteorder == "big":
                tokens.byteswap()  # the format is little-endian, like nanoGPT's on x86/ARM
            tokens.tofile(out)
            total += len(tokens)
        if total == 0:
            raise DataError("--input", "the input files produced no tokens")
    return _token_meta(dtype, vocab_size, total, os.path.abspath(tokenizer_path), len(files))


def _load_tokenizer(path: str):
    try:
        from tokenizers import Tokenizer  # optional dependency, only for --tokenizer
    except ImportError:
        raise DataError("--tokenizer", "needs the 'tokenizers' package: pip install tokenizers") from None
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


@contextlib.contextmanager
def _atomic_write(path: str) -> Iterator[BinaryIO]:
    """Yield a temp file beside `path`; on success fsync it and rename it over `path`, else delete it."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; a shared cache should stay readable
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    _fsync_dir(directory)


def _fsync_dir(directory: str) -> None:
    """Persist the rename itself; not every filesystem supports fsync on a directory."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
