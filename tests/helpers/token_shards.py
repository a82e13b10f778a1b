"""Token files and shard folders written directly, for the mixture tests."""

from __future__ import annotations

import json
import os

import numpy as np


def write_tokens(path, tokens, dtype=np.uint16) -> str:
    np.asarray(tokens, dtype=dtype).tofile(path)
    return str(path)


def write_shards(folder, pieces, dtype="uint16") -> str:
    """A shard folder as `llmtrain data prepare --shard-tokens` writes it: shard files plus index.json."""
    os.makedirs(folder, exist_ok=True)
    shards = []
    for i, piece in enumerate(pieces):
        name = f"shard-{i:05d}.bin"
        write_tokens(os.path.join(folder, name), piece, np.dtype(dtype))
        shards.append({"file": name, "num_tokens": len(piece)})
    index = {"format": "llmtrain-shards-v1", "dtype": dtype, "vocab_size": None, "num_tokens":
             sum(len(p) for p in pieces), "shards": shards}
    with open(os.path.join(folder, "index.json"), "w") as f:
        json.dump(index, f)
    return str(folder)
