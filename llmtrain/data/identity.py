"""What identifies the data a run trains on, recorded in each checkpoint's meta.json and compared before a resume,
so that a token file replaced by another one (even a consistent pair of file and FILE.json) is not resumed silently
on other samples.

A token file (data=memmap, and data=stdlib's built corpus) is identified by its size, a hash of its FILE.json and
a hash of a few fixed blocks spread over it (the first and the last included): cheap for a terabyte file (16 reads
of 64 KiB), and a replaced file almost always differs in one of them; a data=memmap folder of shards as a data=mix
source's. data=synthetic is a function of the config
(train.seed, model.seq_len, model.vocab_size, which the resume diff compares): only its name is recorded.
data=mix records each source by name (a folder of shards: its index.json and blocks sampled over its shards): a
source whose content changed is other data; a changed weight, an added or a dropped source is another mixture.
"""

from __future__ import annotations

import hashlib
import json
import os

from .errors import DataError
from .mixture_config import source_names
from .token_source import index_path
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


def shards_identity(folder: str, blocks: int = BLOCKS, block_bytes: int = BLOCK_BYTES, key: str = "data.sources"
                    ) -> dict:
    """A folder of shards: a hash of its index.json (the shards' names and sizes) and `blocks` blocks spread over
    the shards' concatenation, as file_identity samples one file."""
    folder = os.path.abspath(os.path.expanduser(os.fspath(folder)))
    try:
        with open(index_path(folder), "rb") as f:
            index_bytes = f.read()
        shards = [(os.path.join(folder, e["file"]), os.path.getsize(os.path.join(folder, e["file"])))
                  for e in json.loads(index_bytes).get("shards", []) if isinstance(e, dict) and "file" in e]
        size = sum(n for _, n in shards)
        sampled = hashlib.blake2b(digest_size=16)
        for offset in block_offsets(size, blocks, block_bytes):
            sampled.update(_read_across(shards, offset, block_bytes))
    except (OSError, ValueError) as e:
        raise DataError(key, f"cannot read {getattr(e, 'filename', None) or folder} to identify the "
                                        f"data: {getattr(e, 'strerror', None) or e}") from None
    return {"path": folder, "bytes": size, "meta_blake2b": _digest(index_bytes), "blocks_blake2b": sampled.hexdigest(),
            "blocks": blocks, "block_bytes": block_bytes, "shards": len(shards)}


def _read_across(files: list[tuple[str, int]], offset: int, count: int) -> bytes:
    """`count` bytes from `offset` of the files' concatenation (a block may span a shard's end)."""
    out, start = b"", 0
    for path, nbytes in files:
        if offset < start + nbytes and len(out) < count:
            with open(path, "rb") as f:
                f.seek(max(0, offset - start))
                out += f.read(count - len(out))
        start += nbytes
    return out


def _sampling(like: dict | None) -> dict:
    return {k: like[k] for k in ("blocks", "block_bytes") if like and k in like}


def source_identity(path: str, like: dict | None = None, key: str = "data.sources") -> dict:
    """A token file's identity, or a shard folder's."""
    if os.path.isdir(os.path.expanduser(os.fspath(path))):
        return shards_identity(path, **_sampling(like), key=key)
    return file_identity(path, **_sampling(like))


def data_identity(data_cfg, like: dict | None = None) -> dict:
    """The identity of the data `data_cfg` names; `like` (a recorded identity) gives the blocks to sample, so an
    identity recorded with other sampling is compared like for like. data=mix: each source's, by name."""
    if data_cfg.name == "synthetic":
        return {"name": "synthetic"}
    if data_cfg.name == "mix":
        recorded = (like or {}).get("sources") or {}
        names = source_names(data_cfg.sources)
        return {"name": "mix", "sources": {name: source_identity(source.path, recorded.get(name))
                                           for name, source in zip(names, data_cfg.sources)}}
    return {"name": data_cfg.name, **source_identity(data_cfg.path, like, key="data.path")}


def _what(identity: dict) -> str:
    if identity.get("name") == "mix":
        return f"data=mix ({', '.join(identity.get('sources') or {})})"
    return identity.get("path") or "data=synthetic"


def data_changes(recorded: dict | None, data_cfg) -> str:
    """What differs between the data a checkpoint recorded and the data `data_cfg` names now, in words; "" when
    nothing does, or when the checkpoint recorded nothing (saved before identities were recorded). data=mix:
    a source whose content changed under the same name; added, dropped or reweighted sources are not other data."""
    if not recorded:
        return ""
    now = data_identity(data_cfg, like=recorded)
    if recorded.get("name") == "mix" and now["name"] == "mix":
        was = recorded.get("sources") or {}
        changes = {name: _file_changes(was[name], identity) for name, identity in now["sources"].items()
                   if name in was}
        return "; ".join(f"source {name}: {change}" for name, change in changes.items() if change)
    if "path" not in recorded or "path" not in now:
        was, new = _what(recorded), _what(now)
        return "" if was == new else f"trained on {was}, now {new}"
    return _file_changes(recorded, now)


def _file_changes(recorded: dict, now: dict) -> str:
    changes = []
    if recorded.get("bytes") != now["bytes"]:
        changes.append(f"size {recorded.get('bytes', 0):,} -> {now['bytes']:,} bytes")
    if recorded.get("meta_blake2b") != now["meta_blake2b"]:
        meta = index_path(now["path"]) if "shards" in now else meta_path(now["path"])
        changes.append(f"its meta {meta} " + ("is new" if recorded.get("meta_blake2b") is None
                                              else "is gone" if now["meta_blake2b"] is None else "changed"))
    if recorded.get("blocks_blake2b") != now["blocks_blake2b"]:
        changes.append(f"its sampled blocks differ (blake2b {str(recorded.get('blocks_blake2b'))[:12]} -> "
                       f"{now['blocks_blake2b'][:12]})")
    return f"{now['path']}: " + ", ".join(changes) if changes else ""
