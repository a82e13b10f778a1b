"""The two config sections build_dataset reads, as plain objects: tests of the data layer need no composed config."""

from __future__ import annotations

from types import SimpleNamespace


SEQ_LEN = 8


def data_cfg(name, path=None, dtype=None, val_fraction=0.1, max_bytes=200_000):
    return SimpleNamespace(name=name, path=path, dtype=dtype, val_fraction=val_fraction, max_bytes=max_bytes)


def model_cfg(vocab_size=256, seq_len=SEQ_LEN):
    return SimpleNamespace(vocab_size=vocab_size, seq_len=seq_len)
