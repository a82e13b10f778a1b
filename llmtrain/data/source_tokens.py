"""A token source read by token offset without loading it: one token file, or the shards of a folder as their
concatenation in index.json's order (a read may span two shards). Used by data=memmap and by each source of
data=mix."""

from __future__ import annotations

import bisect

import numpy as np

from .token_source import TokenSource

NUMPY_DTYPES = {"uint16": np.uint16, "uint32": np.uint32}


class SourceTokens:
    """A source's token stream over all its files, read by int64 token offset without loading the files."""

    def __init__(self, source: TokenSource):
        self.path = source.path
        self.dtype = source.dtype
        self.num_tokens = source.num_tokens
        self._maps, self._starts, start = [], [], 0
        for file, count in source.files:
            if count:  # an empty shard holds nothing to map
                self._maps.append(np.memmap(file, dtype=NUMPY_DTYPES[source.dtype], mode="r", shape=(count,)))
                self._starts.append(start)
            start += count

    def read(self, start: int, count: int) -> np.ndarray:
        """Tokens [start, start + count) as int64; pieces from consecutive files are joined."""
        if start < 0 or start + count > self.num_tokens:
            raise IndexError(f"tokens [{start}, {start + count}) out of range [0, {self.num_tokens}) of {self.path}")
        pieces, i = [], bisect.bisect_right(self._starts, start) - 1
        while count > 0:
            local = start - self._starts[i]
            piece = self._maps[i][local: local + count]
            pieces.append(piece.astype(np.int64))
            start, count, i = start + len(piece), count - len(piece), i + 1
        return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)
