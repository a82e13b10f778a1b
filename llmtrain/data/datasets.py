"""Token datasets: fixed-length windows of seq_len+1 tokens (inputs [:-1], targets [1:]).

Each dataset has a "train" and a "val" split; `sample(split, i)` is a pure function of its
arguments, so any rank can fetch any sample without coordination.
"""

from __future__ import annotations

import os
import sys

import torch
from omegaconf.errors import MissingMandatoryValue

from .corpus import ensure_stdlib_corpus, read_token_meta
from .errors import DataError
from .seeding import stable_digest

SPLITS = ("train", "val")
TOKEN_DTYPES = {"uint16": torch.uint16, "uint32": torch.uint32}
DATASET_NAMES = ("synthetic", "memmap", "stdlib")


class TokenDataset:
    """Base class. `vocab_size` bounds the token ids in the data; None when it is unknown."""

    seq_len: int
    vocab_size: int | None
    # Whether the sample stream should shuffle train windows per epoch (see sampling.py).
    shuffle_train: bool = True

    def num_samples(self, split: str) -> int:
        raise NotImplementedError

    def sample(self, split: str, index: int) -> torch.Tensor:
        """LongTensor of shape (seq_len + 1,)."""
        raise NotImplementedError

    def _check_index(self, split: str, index: int) -> None:
        n = self.num_samples(split)  # also validates split
        if not 0 <= index < n:
            raise IndexError(f"{split} sample {index} out of range [0, {n})")


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")


class SyntheticDataset(TokenDataset):
    """Seeded arithmetic sequences mod vocab_size: random start, random stride in ±[1, 7].

    Learnable (a bigram model already cuts the loss from ln(V) to about ln(14); attention can
    infer the stride and do better) yet free to generate: each sample is a hash of
    (seed, split, index), no RNG state and no storage.
    """

    TRAIN_SAMPLES = 2**31 - 1
    VAL_SAMPLES = 1024
    MAX_STRIDE = 7
    shuffle_train = False  # samples are already independent random draws

    def __init__(self, seq_len: int, vocab_size: int, seed: int):
        if seq_len < 1:
            raise DataError("model.seq_len", f"must be >= 1, got {seq_len}")
        if vocab_size < 2:
            raise DataError("model.vocab_size", f"must be >= 2, got {vocab_size}")
        self.seq_len = int(seq_len)
        self.vocab_size = int(vocab_size)
        self.seed = int(seed)
        self._positions = torch.arange(self.seq_len + 1, dtype=torch.long)

    def num_samples(self, split: str) -> int:
        _check_split(split)
        return self.TRAIN_SAMPLES if split == "train" else self.VAL_SAMPLES

    def sample(self, split: str, index: int) -> torch.Tensor:
        self._check_index(split, index)
        digest = stable_digest("synthetic", self.seed, split, index, size=16)
        start = int.from_bytes(digest[:8], "little") % self.vocab_size
        max_stride = min(self.MAX_STRIDE, self.vocab_size - 1)
        draw = int.from_bytes(digest[8:], "little") % (2 * max_stride)
        stride = draw + 1 if draw < max_stride else max_stride - draw - 1  # ±[1, max_stride]
        return (start + stride * self._positions) % self.vocab_size

    def __repr__(self) -> str:
        return f"SyntheticDataset(seq_len={self.seq_len}, vocab_size={self.vocab_size}, seed={self.seed})"


class MemmapDataset(TokenDataset):
    """A nanoGPT-style token file, memory-mapped (pages load on demand, so any size works).

    The first (1 - val_fraction) of the tokens are the train region, the rest the val region.
    Samples are windows of seq_len+1 tokens at stride seq_len inside a region (consecutive
    windows share one token, as target and next input).

    `vocab_size` is what the data's meta says (None if unknown). `token_limit`, when given,
    makes every sample check its ids against it, so a file without meta that does not fit the
    model fails with a DataError instead of an index error (a device-side assert on GPU).
    """

    def __init__(
        self,
        path: str,
        dtype: str,
        seq_len: int,
        val_fraction: float,
        vocab_size: int | None = None,
        token_limit: int | None = None,
    ):
        if dtype not in TOKEN_DTYPES:
            raise DataError("data.dtype", f"must be one of {', '.join(TOKEN_DTYPES)}, got {dtype!r}")
        if not 0.0 < val_fraction < 1.0:
            raise DataError("data.val_fraction", f"must be in (0, 1), got {val_fraction}")
        if seq_len < 1:
            raise DataError("model.seq_len", f"must be >= 1, got {seq_len}")
        if sys.byteorder != "little":
            raise DataError("data.path", "token files are little-endian; this host is big-endian")
        path = os.path.abspath(os.path.expanduser(os.fspath(path)))
        _require_file(path)

        torch_dtype = TOKEN_DTYPES[dtype]
        itemsize = torch_dtype.itemsize
        nbytes = os.path.getsize(path)
        if nbytes % itemsize:
            raise DataError(
                "data.path",
                f"{path} has {nbytes} bytes, not a multiple of {itemsize} ({dtype}); is data.dtype right?",
            )
        num_tokens = nbytes // itemsize
        val_tokens = int(num_tokens * val_fraction)
        train_tokens = num_tokens - val_tokens
        window = seq_len + 1
        if train_tokens < window or val_tokens < window:
            raise DataError(
                "data.path",
                f"{path} has {num_tokens} tokens ({train_tokens} train, {val_tokens} val at "
                f"data.val_fraction={val_fraction}); each region needs at least seq_len+1 = {window}",
            )

        self.path = path
        self.dtype = dtype
        self.seq_len = int(seq_len)
        self.vocab_size = vocab_size
        self.token_limit = token_limit
        self.num_tokens = num_tokens
        self._region_start = {"train": 0, "val": train_tokens}
        # Window k covers [k*seq_len, k*seq_len + seq_len + 1) inside its region.
        self._num_windows = {"train": (train_tokens - 1) // seq_len, "val": (val_tokens - 1) // seq_len}
        # shared=False maps the file copy-on-write: lazy, read-only in effect, never written back.
        self._tokens = torch.from_file(path, shared=False, size=num_tokens, dtype=torch_dtype)

    def num_samples(self, split: str) -> int:
        _check_split(split)
        return self._num_windows[split]

    def sample(self, split: str, index: int) -> torch.Tensor:
        self._check_index(split, index)
        start = self._region_start[split] + index * self.seq_len
        tokens = self._tokens[start : start + self.seq_len + 1].to(torch.long)
        if self.token_limit is not None:
            biggest = int(tokens.max())
            if biggest >= self.token_limit:
                raise DataError(
                    "model.vocab_size",
                    f"{self.path} holds token id {biggest} (near token {start}) but model.vocab_size "
                    f"is {self.token_limit}; raise model.vocab_size or fix data.dtype",
                )
        return tokens

    def __repr__(self) -> str:
        return (
            f"MemmapDataset({self.path!r}, dtype={self.dtype}, seq_len={self.seq_len}, "
            f"tokens={self.num_tokens}, train={self._num_windows['train']}, val={self._num_windows['val']})"
        )


def build_dataset(data_cfg, model_cfg, seed: int) -> TokenDataset:
    """The dataset named by data_cfg.name, checked against the model's seq_len and vocab_size."""
    name = _cfg(data_cfg, "name")
    seq_len = int(model_cfg.seq_len)
    model_vocab = int(model_cfg.vocab_size)

    if name == "synthetic":
        return SyntheticDataset(seq_len, model_vocab, seed)
    if name == "stdlib":
        path = _cfg(data_cfg, "path") or default_stdlib_path()
        path = ensure_stdlib_corpus(path, _cfg(data_cfg, "max_bytes", 16_000_000))
    elif name == "memmap":
        path = _cfg(data_cfg, "path")
        if not path:
            raise DataError("data.path", "required with data.name=memmap (a token file from `llmtrain data prepare`)")
        path = os.path.abspath(os.path.expanduser(str(path)))
        _require_file(path)
    else:
        raise DataError("data.name", f"unknown dataset {name!r}; choose one of {', '.join(DATASET_NAMES)}")

    meta = read_token_meta(path)
    meta_dtype = meta.get("dtype") if meta else None
    dtype = _cfg(data_cfg, "dtype")
    if dtype is None:
        dtype = meta_dtype or "uint16"
    elif meta_dtype is not None and dtype != meta_dtype:
        raise DataError("data.dtype", f"is {dtype} but {path}.json says {meta_dtype}; set data.dtype=null")

    data_vocab = int(meta["vocab_size"]) if meta and meta.get("vocab_size") is not None else None
    if data_vocab is not None and data_vocab > model_vocab:
        raise DataError(
            "model.vocab_size",
            f"is {model_vocab} but {path} has vocab_size {data_vocab}; set model.vocab_size>={data_vocab}",
        )
    return MemmapDataset(
        path,
        dtype,
        seq_len,
        float(_cfg(data_cfg, "val_fraction", 0.05)),
        vocab_size=data_vocab,
        token_limit=None if data_vocab is not None else model_vocab,
    )


def default_stdlib_path() -> str:
    """Same default as configs/data/stdlib.yaml: $LLMTRAIN_CACHE or ~/.cache/llmtrain."""
    cache = os.environ.get("LLMTRAIN_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "llmtrain")
    return os.path.join(cache, "stdlib-bytes.bin")


def _require_file(path: str) -> None:
    if not os.path.isfile(path):
        raise DataError("data.path", f"no such file: {path}")


def _cfg(cfg, key: str, default=None):
    """cfg.key for dataclasses, dicts and DictConfigs; a missing or '???' value reads as default."""
    if isinstance(cfg, dict):
        return cfg.get(key, default)
    try:
        value = getattr(cfg, key, default)
    except MissingMandatoryValue:
        return default
    return default if value is None else value
