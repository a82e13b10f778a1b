"""Token-file facts and checks that need no torch: the `FILE.json` meta, the dtype, the token count,
the train/val split and the vocabulary.

Both the launcher's config validation (before any worker starts or anything is written) and the
workers' datasets call these, so a file that does not fit the run is refused the same way, with
the same one-line message, in both places.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass

from .errors import DataError

TOKEN_FORMAT = "llmtrain-tokens-v1"
# Bytes per token of each on-disk dtype (little-endian unsigned integers).
TOKEN_ITEMSIZE = {"uint16": 2, "uint32": 4}
# Vocabulary sizes each dtype can hold (ids 0 .. limit - 1).
TOKEN_ID_LIMIT = {"uint16": 2**16, "uint32": 2**32}
DEFAULT_DTYPE = "uint16"


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
    if meta.get("dtype") is not None and meta["dtype"] not in TOKEN_ITEMSIZE:
        raise DataError("data.path", f"{sidecar} has an unknown dtype {meta['dtype']!r}")
    for key in ("vocab_size", "num_tokens"):
        value = meta.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
            raise DataError("data.path", f"{sidecar} has an invalid {key} {value!r}")
    return meta


def split_sizes(num_tokens: int, val_fraction: float) -> tuple[int, int]:
    """(train, val) token counts: the last int(num_tokens * val_fraction) tokens are the val region."""
    val_tokens = int(num_tokens * val_fraction)
    return num_tokens - val_tokens, val_tokens


def num_windows(region_tokens: int, seq_len: int) -> int:
    """Samples of seq_len+1 tokens at stride seq_len that fit in a region (they share one token)."""
    return max(0, (region_tokens - 1) // seq_len)


@dataclass(frozen=True)
class TokenFile:
    """What is known about a token file without reading its tokens."""

    path: str
    dtype: str
    num_tokens: int
    vocab_size: int | None  # from the meta; None when the file has none


def inspect_token_file(path: str, dtype: str | None = None) -> TokenFile:
    """Resolve the dtype (`dtype`, else the meta's, else uint16) and count the tokens.

    Raises DataError for a missing file, an unreadable meta, a `dtype` the meta contradicts or
    whose ids cannot reach the meta's vocabulary, a size that is not a whole number of tokens, or
    a size that disagrees with the meta's count.
    """
    path = os.path.abspath(os.path.expanduser(os.fspath(path)))
    if not os.path.isfile(path):
        raise DataError("data.path", f"no such file: {path}")
    meta = read_token_meta(path)
    meta_dtype = meta.get("dtype") if meta else None
    if dtype is None:
        dtype = meta_dtype or DEFAULT_DTYPE
    elif dtype not in TOKEN_ITEMSIZE:
        raise DataError("data.dtype", f"must be one of {', '.join(TOKEN_ITEMSIZE)}, got {dtype!r}")
    elif meta_dtype is not None and dtype != meta_dtype:
        raise DataError(
            "data.dtype", f"is {dtype} but {meta_path(path)} says {meta_dtype}; set data.dtype={meta_dtype} (or null)"
        )
    vocab = meta.get("vocab_size") if meta else None
    if vocab is not None and vocab > TOKEN_ID_LIMIT[dtype]:
        # Llama 3's 128256 ids do not fit uint16: such a meta is wrong, or the ids lost their high bits.
        key = "data.dtype" if meta_dtype is None else "data.path"
        raise DataError(
            key,
            f"{path} is read as {dtype} but {meta_path(path)} says vocab_size {vocab}; {dtype} holds ids below "
            f"{TOKEN_ID_LIMIT[dtype]}: prepare it again (`llmtrain data prepare` writes uint32 for a vocabulary "
            "of 65536 ids or more)" + (" or set data.dtype=uint32" if meta_dtype is None else ""),
        )
    itemsize = TOKEN_ITEMSIZE[dtype]
    nbytes = os.path.getsize(path)
    if nbytes % itemsize:
        raise DataError(
            "data.path",
            f"{path} has {nbytes} bytes, not a multiple of {itemsize} ({dtype}); is data.dtype right?",
        )
    num_tokens = nbytes // itemsize
    if meta and meta.get("num_tokens") is not None and meta["num_tokens"] != num_tokens:
        raise DataError(
            "data.path",
            f"{path} holds {num_tokens} {dtype} tokens but {meta_path(path)} says {meta['num_tokens']}; "
            "the file is truncated or was changed: prepare it again",
        )
    return TokenFile(path, dtype, num_tokens, vocab)


def check_vocab(info: TokenFile, model_vocab: int) -> None:
    """The model must have an embedding row for every token id the data can hold."""
    if info.vocab_size is not None and info.vocab_size > model_vocab:
        raise DataError(
            "model.vocab_size",
            f"is {model_vocab} but {info.path} has vocab_size {info.vocab_size}; "
            f"set model.vocab_size={info.vocab_size} (or larger)",
        )


def check_split_sizes(
    path: str,
    num_tokens: int,
    seq_len: int,
    val_fraction: float,
    need_val: bool = True,
    key: str = "data.path",
    more: str = "use more data",
) -> None:
    """Refuse a file whose train region (or val region, when `need_val`) holds no sample of seq_len+1 tokens.
    `key` is the setting at fault and `more` how to get more tokens, for the message."""
    window = seq_len + 1
    train_tokens, val_tokens = split_sizes(num_tokens, val_fraction)
    if num_windows(train_tokens, seq_len) < 1:
        raise DataError(
            key,
            f"{path} has {num_tokens} tokens, {train_tokens} of them for training at data.val_fraction="
            f"{val_fraction}; one training sequence needs model.seq_len+1 = {window}: {more} or use a "
            "smaller model.seq_len",
        )
    if need_val:
        check_val_size(path, num_tokens, seq_len, val_fraction, key, more)


def check_val_size(
    path: str, num_tokens: int, seq_len: int, val_fraction: float, key: str = "data.path", more: str = "use more data"
) -> None:
    """Refuse a file whose val region holds no sample of seq_len+1 tokens (evaluation needs one)."""
    window = seq_len + 1
    _, val_tokens = split_sizes(num_tokens, val_fraction)
    if num_windows(val_tokens, seq_len) >= 1:
        return
    fix = "or set train.eval_interval=0 (no evaluation)"
    # Smallest fraction (3 decimals) giving `window` val tokens, if the train region still fits one then.
    fraction = math.ceil(window / num_tokens * 1000) / 1000 if num_tokens else 1.0
    while fraction < 1.0 and int(num_tokens * fraction) < window:
        fraction = round(fraction + 0.001, 3)
    if fraction < 1.0 and num_windows(split_sizes(num_tokens, fraction)[0], seq_len) >= 1:
        fix = f"raise data.val_fraction to {fraction} {fix}"
    else:
        fix = f"{more} (at least {2 * window} tokens), use a smaller model.seq_len, {fix}"
    raise DataError(
        key,
        f"{path} has {num_tokens} tokens, {val_tokens} of them for validation (the last data.val_fraction="
        f"{val_fraction}); evaluation needs at least model.seq_len+1 = {window}: {fix}",
    )


def check_token_file(
    path: str,
    *,
    dtype: str | None,
    seq_len: int,
    val_fraction: float,
    model_vocab: int,
    need_val: bool,
) -> TokenFile:
    """Every check a token file must pass before training on it; returns its facts."""
    info = inspect_token_file(path, dtype)
    check_vocab(info, model_vocab)
    check_split_sizes(info.path, info.num_tokens, seq_len, val_fraction, need_val)
    return info
