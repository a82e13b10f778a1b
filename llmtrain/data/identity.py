"""What identifies the data a run trains on, recorded in each checkpoint's meta.json and compared before a resume,
so that a token file replaced by another one (even a consistent pair of file and FILE.json) is not resumed silently
on other samples.

A token file (data=memmap, and data=stdlib's built corpus) is identified by its size, a hash of its FILE.json and
a hash of a few fixed blocks spread over it (the first and the last included): cheap for a terabyte file (16 reads
of 64 KiB), and a replaced file almost always differs in one of them. data=synthetic is a function of the config
(train.seed, model.seq_len, model.vocab_size, which the resume diff compares): only its name is recorded.
"""

from __future__ import annotations

import hashlib
import os

from .errors import DataError
from .tokenfile import meta_path

BLOCKS = 16
BLOCK_BYTES = 64 * 1024


def block_offsets(size: int, blocks: int = BLOCKS, block_bytes: int = BLOCK_BYTES) -> list[int]:
    """Where the sampled blocks start: the whole file when it is small, else `blocks` evenly spread blocks."""
    if size <= blocks * block_bytes:
        return list(range(0, size, block_bytes))
    last = size - block_bytes
    return [i * last // (blocks - 1) for i in range(blocks)]


def _digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def file_identity(path: str, blocks: int = BLOCKS, block_bytes: int = BLOCK_BYTES) -> dict:
    path = os.path.abspath(os.path.expanduser(os.fspath(path)))
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            sampled = hashlib.blake2b(digest_size=16)
            for offset in block_offsets(size, blocks, block_bytes):
                f.seek(offset)
                sampled.update(f.read(block_bytes))
        try:
            with open(meta_path(path), "rb") as f:
                meta = _digest(f.read())
        except FileNotFoundError:
            meta = None
    except OSError as e:
        raise DataError("data.path", f"cannot read {e.filename or path} to identify the data: "
                                     f"{e.strerror or e}") from None
    return {"path": path, "bytes": size, "meta_blake2b": meta, "blocks_blake2b": sampled.hexdigest(),
            "blocks": blocks, "block_bytes": block_bytes}


def data_identity(data_cfg, like: dict | None = None) -> dict:
    """The identity of the data `data_cfg` names; `like` (a recorded identity) gives the blocks to sample, so an
    identity recorded with other sampling is compared like for like."""
    if data_cfg.name == "synthetic":
        return {"name": "synthetic"}
    sampling = {k: like[k] for k in ("blocks", "block_bytes") if like and k in like}
    return {"name": data_cfg.name, **file_identity(data_cfg.path, **sampling)}


def data_changes(recorded: dict | None, data_cfg) -> str:
    """What differs between the data a checkpoint recorded and the data `data_cfg` names now, in words; "" when
    nothing does, or when the checkpoint recorded nothing (saved before identities were recorded)."""
    if not recorded:
        return ""
    now = data_identity(data_cfg, like=recorded)
    if "path" not in recorded or "path" not in now:
        was, new = (recorded.get("path") or "data=synthetic"), (now.get("path") or "data=synthetic")
        return "" if was == new else f"trained on {was}, now {new}"
    changes = []
    if recorded.get("bytes") != now["bytes"]:
        changes.append(f"size {recorded.get('bytes', 0):,} -> {now['bytes']:,} bytes")
    if recorded.get("meta_blake2b") != now["meta_blake2b"]:
        changes.append(f"its meta {meta_path(now['path'])} " + ("is new" if recorded.get("meta_blake2b") is None
                                                                else "is gone" if now["meta_blake2b"] is None
                                                                else "changed"))
    if recorded.get("blocks_blake2b") != now["blocks_blake2b"]:
        changes.append(f"its sampled blocks differ (blake2b {str(recorded.get('blocks_blake2b'))[:12]} -> "
                       f"{now['blocks_blake2b'][:12]})")
    return f"{now['path']}: " + ", ".join(changes) if changes else ""
