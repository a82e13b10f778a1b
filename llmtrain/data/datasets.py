"""Token datasets: fixed-length windows of seq_len+1 tokens (inputs [:-1], targets [1:]).

Each dataset has a "train" and a "val" split; `sample(split, i)` is a pure function of its
arguments, so any rank can fetch any sample without coordination.
"""

from __future__ import annotations

import os
import sys

import torch

from .corpus import ensure_stdlib_corpus
from .errors import DataError
from .seeding import stable_digest
from .source_tokens import SourceTokens
from .token_source import index_path, inspect_token_source
from .tokenfile import (
    check_split_sizes,
    check_val_size,
    check_vocab,
    meta_path,
    num_windows,
    split_sizes,
)

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
    """A nanoGPT-style token file, memory-mapped (pages load on demand, so any size works), or a folder of shards
    written by `llmtrain data prepare --shard-tokens`, read as their concatenation in index.json's order (windows
    may span two shards), so it gives the samples of the same tokens prepared as one file.

    The first (1 - val_fraction) of the tokens are the train region, the rest the val region.
    Samples are windows of seq_len+1 tokens at stride seq_len inside a region (consecutive
    windows share one token, as target and next input).

    `vocab_size` is what the data's meta says (None if unknown). Every sample checks its ids
    against it (else against `token_limit`, the model's vocabulary), so a file read with the
    wrong dtype, or without meta, fails with a DataError naming the file and the dtype instead of
    an index error in the embedding (a device-side assert on GPU).
    With `require_val=False` a val region too small for one sample is accepted until a val
    sample is asked for (a run without evaluation never asks).
    """

    def __init__(
        self,
        path: str,
        dtype: str,
        seq_len: int,
        val_fraction: float,
        vocab_size: int | None = None,
        token_limit: int | None = None,
        require_val: bool = True,
    ):
        if dtype not in TOKEN_DTYPES:
            raise DataError("data.dtype", f"must be one of {', '.join(TOKEN_DTYPES)}, got {dtype!r}")
        if sys.byteorder != "little":
            raise DataError("data.path", "token files are little-endian; this host is big-endian")
        info = inspect_token_source(path, dtype)
        # Without require_val the val region may hold no sample: reading one then raises (see num_samples).
        check_split_sizes(info.path, info.num_tokens, seq_len, val_fraction, need_val=require_val)
        train_tokens, val_tokens = split_sizes(info.num_tokens, val_fraction)

        self.path = info.path
        self.dtype = dtype
        self.seq_len = int(seq_len)
        self.val_fraction = float(val_fraction)
        self.vocab_size = vocab_size
        self.token_limit = token_limit
        self.num_tokens = info.num_tokens
        self._region_start = {"train": 0, "val": train_tokens}
        # Window k covers [k*seq_len, k*seq_len + seq_len + 1) inside its region.
        self._num_windows = {"train": num_windows(train_tokens, seq_len), "val": num_windows(val_tokens, seq_len)}
        self._tokens = SourceTokens(info)  # memory-mapped read-only: pages load on demand

    def num_samples(self, split: str) -> int:
        _check_split(split)
        if split == "val" and not self._num_windows["val"]:
            check_val_size(self.path, self.num_tokens, self.seq_len, self.val_fraction)
        return self._num_windows[split]

    def sample(self, split: str, index: int) -> torch.Tensor:
        self._check_index(split, index)
        start = self._region_start[split] + index * self.seq_len
        tokens = self._read(start, self.seq_len + 1)
        limit = self.vocab_size if self.vocab_size is not None else self.token_limit
        if limit is not None:
            biggest = int(tokens.max())
            if biggest >= limit:
                raise self._id_error(biggest, start, limit)
        return tokens

    def _read(self, start: int, count: int) -> torch.Tensor:
        """Tokens [start, start + count) of the file, or of the shards' concatenation, as int64."""
        return torch.from_numpy(self._tokens.read(start, count))

    def _id_error(self, token_id: int, start: int, limit: int) -> DataError:
        read_as = f"read as {self.dtype}"
        if self.vocab_size is not None:
            meta = index_path(self.path) if os.path.isdir(self.path) else meta_path(self.path)
            return DataError(
                "data.path",
                f"{self.path} holds token id {token_id} (near token {start}, {read_as}) but its meta "
                f"{meta} says vocab_size {self.vocab_size}: the meta's dtype or vocab_size is "
                "wrong for this file; prepare it again",
            )
        return DataError(
            "model.vocab_size",
            f"{self.path} holds token id {token_id} (near token {start}, {read_as}) but model.vocab_size "
            f"is {limit}; raise model.vocab_size or fix data.dtype",
        )

    def __repr__(self) -> str:
        return (
            f"MemmapDataset({self.path!r}, dtype={self.dtype}, seq_len={self.seq_len}, "
            f"tokens={self.num_tokens}, train={self._num_windows['train']}, val={self._num_windows['val']})"
        )


def build_dataset(data_cfg, model_cfg, seed: int) -> TokenDataset:
    """The dataset named by data_cfg.name, checked against the model's seq_len and vocab_size.

    The config was validated before launch (names, fractions, sizes, and the token file itself through
    llmtrain.data.tokenfile); what is checked here is what may have changed since: the file on disk. The val
    region is only required when a val sample is read.
    """
    name = data_cfg.name
    seq_len = int(model_cfg.seq_len)
    model_vocab = int(model_cfg.vocab_size)

    if name == "synthetic":
        return SyntheticDataset(seq_len, model_vocab, seed)
    path = ensure_stdlib_corpus(data_cfg.path, data_cfg.max_bytes) if name == "stdlib" else data_cfg.path
    info = inspect_token_source(str(path), data_cfg.dtype)
    check_vocab(info, model_vocab)
    return MemmapDataset(
        info.path,
        info.dtype,
        seq_len,
        float(data_cfg.val_fraction),
        vocab_size=info.vocab_size,
        token_limit=None if info.vocab_size is not None else model_vocab,
        require_val=False,
    )

