"""Where `llmtrain data prepare` puts its tokens: one token file plus `FILE.json`, or (`--shard-tokens N`) a folder
of shards of N tokens each, every one with its own meta, and `index.json` listing them.

Either output replaces the old one whole or not at all: the single file and its meta are renamed over the old pair
with signals held between the two renames; a shard folder is built as a temp folder beside OUT and swapped in with
signals held (the old folder moved aside, then deleted)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile

from .atomic_files import atomic_write, fsync_dir, signals_held
from .errors import DataError
from .file_copy import copy_range
from .prepare_leftovers import temp_prefix
from .tokenfile import TOKEN_FORMAT, TOKEN_ITEMSIZE, meta_path

SHARDS_FORMAT = "llmtrain-shards-v1"
SHARD_INDEX = "index.json"


def shard_name(index: int) -> str:
    return f"shard-{index:05d}.bin"


def write_meta(path: str, meta: dict, owned: bool = False) -> None:
    """Write `path`'s meta atomically; `owned`: its temp file is named after this process (prepare_leftovers)."""
    with atomic_write(meta_path(path), temp_prefix(meta_path(path)) if owned else None) as out:
        out.write(_json_bytes(meta))


def check_output(output: str, sharded: bool) -> None:
    """Refuse, before any work, an OUT that this kind of output must not replace."""
    if not sharded and os.path.isdir(output):
        raise DataError("--output", f"{output} is a folder; without --shard-tokens the output is one token file")
    if sharded and os.path.islink(output):
        raise DataError("--output", f"{output} is a symbolic link; --shard-tokens replaces a folder whole: give "
                                    "the folder's own path")
    if sharded and os.path.lexists(output) and not os.path.isdir(output):
        raise DataError("--output", f"{output} is a file; --shard-tokens writes a folder: remove it or choose "
                                    "another --output")
    if sharded and os.path.isdir(output) and os.listdir(output) and not _is_shard_folder(output):
        raise DataError("--output", f"{output} is a folder without a {SHARDS_FORMAT} {SHARD_INDEX}; "
                                    "--shard-tokens replaces only a shard folder: choose another --output")


def _is_shard_folder(path: str) -> bool:
    try:
        with open(os.path.join(path, SHARD_INDEX), encoding="utf-8") as f:
            return json.load(f).get("format") == SHARDS_FORMAT
    except (OSError, ValueError, AttributeError):
        return False


class SingleFileWriter:
    """OUT (tokens appended part by part) and OUT.json, replacing the old pair together at commit."""

    def __init__(self, output: str):
        self.output = output
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> "SingleFileWriter":
        self._out = self._stack.enter_context(atomic_write(self.output, temp_prefix(self.output)))
        return self

    def append(self, part: str, nbytes: int) -> None:
        self._out.flush()
        with open(part, "rb") as src:
            copy_range(src.fileno(), self._out.fileno(), 0, nbytes)

    def mark(self) -> int:
        """Where the tokens appended next start, for `rollback`."""
        self._out.flush()
        return os.lseek(self._out.fileno(), 0, os.SEEK_CUR)

    def rollback(self, mark: int) -> None:
        """Take back what was appended since `mark` (a file whose later chunk turned out not to be text)."""
        self._out.flush()
        os.ftruncate(self._out.fileno(), mark)
        os.lseek(self._out.fileno(), mark, os.SEEK_SET)

    def commit(self, meta: dict) -> None:
        # From here a Ctrl-C waits: the data file and its meta replace the old pair together, or neither does.
        with signals_held():
            self._stack.close()  # fsync and rename the data file
            write_meta(self.output, meta, owned=True)

    def __exit__(self, *exc) -> None:
        self._stack.__exit__(*exc)  # not committed: the temp file is deleted


class ShardWriter:
    """OUT/shard-00000.bin, ... of `shard_tokens` tokens each (the last fewer), each with its meta, then
    OUT/index.json; built in a temp folder beside OUT and swapped in at commit."""

    def __init__(self, output: str, shard_tokens: int, meta: dict):
        self.output = output
        self.meta = meta  # dtype, vocab_size, tokenizer: the same for every shard
        self.shard_bytes = shard_tokens * TOKEN_ITEMSIZE[meta["dtype"]]
        self.shards: list[dict] = []
        self._fd: int | None = None
        self._filled = 0
        self._tmp: str | None = None

    def __enter__(self) -> "ShardWriter":
        parent = os.path.dirname(self.output)
        os.makedirs(parent, exist_ok=True)
        self._tmp = tempfile.mkdtemp(dir=parent, prefix=temp_prefix(self.output), suffix=".tmp")
        return self

    def append(self, part: str, nbytes: int) -> None:
        with open(part, "rb") as src:
            offset = 0
            while offset < nbytes:
                if self._fd is None:
                    path = os.path.join(self._tmp, shard_name(len(self.shards)))
                    self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                step = min(nbytes - offset, self.shard_bytes - self._filled)
                copy_range(src.fileno(), self._fd, offset, step)
                offset += step
                self._filled += step
                if self._filled == self.shard_bytes:
                    self._close_shard()

    def mark(self) -> tuple[int, int]:
        """Where the tokens appended next start (shard, bytes in it), for `rollback`."""
        return len(self.shards), self._filled

    def rollback(self, mark: tuple[int, int]) -> None:
        """Take back what was appended since `mark`: later shards deleted, the marked one cut back."""
        index, filled = mark
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        for later in range(index + 1, len(self.shards) + 1):
            _unlink(os.path.join(self._tmp, shard_name(later)))
            _unlink(meta_path(os.path.join(self._tmp, shard_name(later))))
        path = os.path.join(self._tmp, shard_name(index))
        _unlink(meta_path(path))
        if filled:
            self._fd = os.open(path, os.O_WRONLY)
            os.ftruncate(self._fd, filled)
            os.lseek(self._fd, filled, os.SEEK_SET)
        else:
            _unlink(path)
        del self.shards[index:]
        self._filled = filled

    def _close_shard(self) -> None:
        os.fsync(self._fd)
        os.close(self._fd)
        self._fd = None
        name = shard_name(len(self.shards))
        num_tokens = self._filled // TOKEN_ITEMSIZE[self.meta["dtype"]]
        shard_meta = {"format": TOKEN_FORMAT, "dtype": self.meta["dtype"], "vocab_size": self.meta["vocab_size"],
                      "num_tokens": num_tokens, "tokenizer": self.meta["tokenizer"]}
        _write_synced(meta_path(os.path.join(self._tmp, name)), _json_bytes(shard_meta))
        self.shards.append({"file": name, "num_tokens": num_tokens})
        self._filled = 0

    def commit(self, num_tokens: int, documents: int, sources: int) -> dict:
        """Write index.json last and swap the folder in; returns the index."""
        if self._fd is not None:
            self._close_shard()
        index = {"format": SHARDS_FORMAT, "dtype": self.meta["dtype"], "vocab_size": self.meta["vocab_size"],
                 "tokenizer": self.meta["tokenizer"], "num_tokens": num_tokens, "documents": documents,
                 "sources": sources, "shards": self.shards}
        _write_synced(os.path.join(self._tmp, SHARD_INDEX), _json_bytes(index))
        os.chmod(self._tmp, 0o755)  # mkdtemp makes 0700; a shared cache should stay readable
        fsync_dir(self._tmp)
        parent, base = os.path.split(self.output)
        with signals_held():
            old = None
            if os.path.lexists(self.output):
                old = tempfile.mkdtemp(dir=parent, prefix=temp_prefix(self.output) + "old-")
                os.rename(self.output, os.path.join(old, base))
            os.rename(self._tmp, self.output)
            self._tmp = None
            fsync_dir(parent)
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)
        return index

    def __exit__(self, *exc) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._tmp is not None:  # not committed
            shutil.rmtree(self._tmp, ignore_errors=True)


def _unlink(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def _json_bytes(obj: dict) -> bytes:
    return (json.dumps(obj, indent=2) + "\n").encode("utf-8")


def _write_synced(path: str, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
