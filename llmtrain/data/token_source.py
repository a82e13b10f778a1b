"""A token source: one token file, or a folder of shards that `llmtrain data prepare --shard-tokens` wrote with an
`index.json` listing them in order (their concatenation is the source's token stream). Facts and checks only, from
sizes and meta files, without torch: the launcher's validation and the workers' loaders read a source the same way.

index.json: {"format": "llmtrain-shards-v1", "dtype", "vocab_size", "tokenizer", "num_tokens", "documents",
"sources", "shards": [{"file": "shard-00000.bin", "num_tokens": N}, ...]}; each shard also has its own FILE.json.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from .errors import DataError
from .tokenfile import TOKEN_ID_LIMIT, TOKEN_ITEMSIZE, check_split_sizes, check_vocab, inspect_token_file

SHARDS_FORMAT = "llmtrain-shards-v1"
INDEX_NAME = "index.json"


@dataclass(frozen=True)
class TokenSource:
    path: str  # the token file, or the shard folder
    dtype: str
    num_tokens: int
    vocab_size: int | None
    files: tuple[tuple[str, int], ...]  # (absolute path, tokens) of each file, in stream order


def index_path(folder: str) -> str:
    return os.path.join(folder, INDEX_NAME)


def inspect_token_source(path: str, dtype: str | None = None, key: str = "data.path") -> TokenSource:
    """The facts of a token file or shard folder; DataError (naming `key`) when it is missing or inconsistent."""
    path = os.path.abspath(os.path.expanduser(os.fspath(path)))
    if os.path.isdir(path):
        return _inspect_shards(path, dtype, key)
    try:
        info = inspect_token_file(path, dtype)
    except DataError as e:
        raise DataError(key if e.key == "data.path" else e.key, e.message) from None
    return TokenSource(info.path, info.dtype, info.num_tokens, info.vocab_size, ((info.path, info.num_tokens),))


def _inspect_shards(folder: str, dtype: str | None, key: str) -> TokenSource:
    index_file = index_path(folder)
    try:
        with open(index_file, encoding="utf-8") as f:
            index = json.load(f)
    except FileNotFoundError:
        raise DataError(key, f"{folder} is a folder without {INDEX_NAME}: give a token file, or a folder written by "
                             "`llmtrain data prepare --shard-tokens N`") from None
    except (OSError, ValueError) as e:
        raise DataError(key, f"cannot read {index_file}: {e}") from None
    if not isinstance(index, dict) or index.get("format") != SHARDS_FORMAT or not isinstance(index.get("shards"), list):
        raise DataError(key, f"{index_file} is not a {SHARDS_FORMAT} index")
    recorded = index.get("dtype")
    if recorded not in TOKEN_ITEMSIZE:
        raise DataError(key, f"{index_file} has an unknown dtype {recorded!r}")
    if dtype is not None and dtype != recorded:
        raise DataError("data.dtype", f"is {dtype} but {index_file} says {recorded}; set data.dtype={recorded} "
                                      "(or null)")
    vocab = index.get("vocab_size")
    if vocab is not None and (not isinstance(vocab, int) or vocab > TOKEN_ID_LIMIT[recorded]):
        raise DataError(key, f"{index_file} has an invalid vocab_size {vocab!r} for {recorded}")
    files, total = [], 0
    for entry in index["shards"]:
        name, count = (entry.get("file"), entry.get("num_tokens")) if isinstance(entry, dict) else (None, None)
        if not isinstance(name, str) or os.path.basename(name) != name or not isinstance(count, int) or count < 0:
            raise DataError(key, f"{index_file} has a malformed shard entry {entry!r}")
        shard = os.path.join(folder, name)
        try:
            nbytes = os.path.getsize(shard)
        except OSError:
            raise DataError(key, f"{shard} is listed in {index_file} but missing") from None
        if nbytes != count * TOKEN_ITEMSIZE[recorded]:
            raise DataError(key, f"{shard} has {nbytes} bytes but {index_file} says {count} {recorded} tokens; the "
                                 "shard is truncated or was changed: prepare it again")
        files.append((shard, count))
        total += count
    if index.get("num_tokens") is not None and index["num_tokens"] != total:
        raise DataError(key, f"{index_file} says {index['num_tokens']} tokens but its shards hold {total}")
    if not files:
        raise DataError(key, f"{index_file} lists no shards")
    return TokenSource(folder, recorded, total, vocab, tuple(files))


def check_token_source(path: str, *, dtype: str | None, seq_len: int, val_fraction: float, model_vocab: int,
                       need_val: bool, key: str = "data.path") -> TokenSource:
    """Every check a source must pass before training on it (as check_token_file for one file); returns its facts."""
    source = inspect_token_source(path, dtype, key)
    try:
        check_vocab(source, model_vocab)
        check_split_sizes(source.path, source.num_tokens, seq_len, val_fraction, need_val, key=key)
    except DataError as e:
        raise DataError(key if e.key == "data.path" else e.key, e.message) from None
    return source
