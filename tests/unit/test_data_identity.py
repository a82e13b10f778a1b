"""The data's identity in each checkpoint: the same file gives the same identity, a change in a sampled block, the
size or FILE.json changes it, and identifying a file reads only a few blocks of it, whatever its size."""

from __future__ import annotations

import builtins
import json
import os

import pytest
from omegaconf import OmegaConf

from helpers.bytes_edit import flip

from llmtrain.data import identity
from llmtrain.data.identity import BLOCK_BYTES, BLOCKS, block_offsets, data_changes, data_identity, file_identity


def token_pair(path, size: int, seed: int = 0) -> str:
    data = bytes((i * 7 + seed) % 251 for i in range(size))
    with open(path, "wb") as f:
        f.write(data)
    with open(str(path) + ".json", "w") as f:
        json.dump({"format": "llmtrain-tokens-v1", "dtype": "uint16", "num_tokens": size // 2}, f)
    return str(path)


def memmap(path) -> OmegaConf:
    return OmegaConf.create({"name": "memmap", "path": str(path)})


def test_same_file_same_identity_and_a_changed_sampled_block_changes_it(tmp_path):
    path = token_pair(tmp_path / "t.bin", 4 * 2**20)
    recorded = data_identity(memmap(path))
    assert recorded["bytes"] == 4 * 2**20 and recorded["name"] == "memmap"
    assert data_identity(memmap(path)) == recorded and data_changes(recorded, memmap(path)) == ""
    offsets = block_offsets(4 * 2**20)
    assert len(offsets) == BLOCKS and offsets[0] == 0 and offsets[-1] == 4 * 2**20 - BLOCK_BYTES
    flip(path, offsets[7] + 100)  # same size, same meta, one byte inside a sampled block
    change = data_changes(recorded, memmap(path))
    assert change.startswith(f"{path}: its sampled blocks differ (blake2b {recorded['blocks_blake2b'][:12]} -> ")
    assert "size" not in change and "meta" not in change
    flip(path, offsets[7] + 100)
    flip(path, offsets[7] + BLOCK_BYTES + 100)  # between sampled blocks: not seen (the price of reading 1 MiB)
    assert data_changes(recorded, memmap(path)) == ""


def test_a_replaced_consistent_pair_names_size_and_meta(tmp_path):
    path = token_pair(tmp_path / "t.bin", 300_000)
    recorded = data_identity(memmap(path))
    token_pair(tmp_path / "t.bin", 300_002, seed=3)
    change = data_changes(recorded, memmap(path))
    assert change.startswith(f"{path}: size 300,000 -> 300,002 bytes, its meta {path}.json changed, its sampled ")
    # A moved copy of the same data is the same data (the path is shown, not compared).
    os.rename(path, tmp_path / "moved.bin")
    os.rename(path + ".json", tmp_path / "moved.bin.json")
    assert data_changes(data_identity(memmap(tmp_path / "moved.bin")), memmap(tmp_path / "moved.bin")) == ""


def test_synthetic_and_unrecorded_identities():
    synthetic = OmegaConf.create({"name": "synthetic", "path": None})
    assert data_identity(synthetic) == {"name": "synthetic"}
    assert data_changes({"name": "synthetic"}, synthetic) == ""
    assert data_changes(None, synthetic) == "" and data_changes({}, synthetic) == ""  # saved before identities


def test_a_terabyte_scale_file_is_identified_from_a_few_blocks(tmp_path, monkeypatch):
    path = tmp_path / "huge.bin"
    with open(path, "wb") as f:
        f.truncate(2**40)  # 1 TiB, sparse
    read = []

    class Counting:
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def seek(self, offset):
            return self.f.seek(offset)

        def read(self, n=-1):
            data = self.f.read(n)
            read.append(len(data))
            return data

    monkeypatch.setattr(identity, "open", lambda *a, **k: Counting(builtins.open(*a, **k)), raising=False)
    found = file_identity(str(path))
    assert found["bytes"] == 2**40 and found["meta_blake2b"] is None
    assert len(read) == BLOCKS and sum(read) == BLOCKS * BLOCK_BYTES == 2**20


def test_an_unreadable_file_is_a_data_error_naming_it(tmp_path):
    from llmtrain.data import DataError

    with pytest.raises(DataError) as e:
        file_identity(str(tmp_path / "missing.bin"))
    assert e.value.key == "data.path" and "missing.bin to identify the data" in str(e.value)
