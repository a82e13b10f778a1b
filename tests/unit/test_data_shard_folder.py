"""data=memmap on a folder of shards (`llmtrain data prepare --shard-tokens N`): accepted by the launcher's data
probe, read as the shards' concatenation (the samples of the same tokens prepared as one file), identified by its
index and shards; a folder that is not a shard folder is one line naming data.path."""

from __future__ import annotations

import json

import pytest
import torch
from helpers.corpus_files import write_corpus

from llmtrain.config import ConfigError, compose_config
from llmtrain.data.corpus import prepare_corpus
from llmtrain.data.datasets import build_dataset
from llmtrain.data.identity import data_changes, data_identity
from llmtrain.launch.config_probes import validate_here

SEQ = 16


@pytest.fixture
def prepared(tmp_path):
    """The same corpus as one token file and as shards of 1,000 tokens (not a multiple of SEQ: windows span
    shards)."""
    corpus = write_corpus(tmp_path / "in", files=3, words=2000)
    single, folder = tmp_path / "one.bin", tmp_path / "shards"
    prepare_corpus([str(corpus)], str(single))
    index = prepare_corpus([str(corpus)], str(folder), shard_tokens=1000)
    assert len(index["shards"]) > 20
    return single, folder


def memmap_cfg(path, *overrides):
    return compose_config(["data=memmap", f"data.path={path}", "model=gpt-tiny", f"model.seq_len={SEQ}",
                           "train.max_steps=10", *overrides])


def test_the_probe_accepts_a_shard_folder_and_names_data_path_for_other_folders(prepared, tmp_path):
    single, folder = prepared
    validate_here(memmap_cfg(folder))
    validate_here(memmap_cfg(single))
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "a.bin").write_bytes(b"\0" * 64)
    with pytest.raises(ConfigError) as err:
        validate_here(memmap_cfg(tmp_path / "plain"))
    assert (err.value.key, err.value.message) == (
        "data.path", f"{tmp_path / 'plain'} is a folder without index.json: give a token file, or a folder written "
                     "by `llmtrain data prepare --shard-tokens N`")
    # The folder's index is checked like a file's meta: its vocabulary against the model's.
    with pytest.raises(ConfigError) as err:
        validate_here(memmap_cfg(folder, "model.vocab_size=100"))
    assert (err.value.key, err.value.message) == (
        "model.vocab_size", f"is 100 but {folder} has vocab_size 256; set model.vocab_size=256 (or larger)")


def test_a_shard_folder_gives_the_samples_of_the_same_tokens_as_one_file(prepared):
    single, folder = prepared
    one = build_dataset(memmap_cfg(single).data, memmap_cfg(single).model, seed=0)
    sharded = build_dataset(memmap_cfg(folder).data, memmap_cfg(folder).model, seed=0)
    for split in ("train", "val"):
        assert sharded.num_samples(split) == one.num_samples(split) > 0
        for i in range(one.num_samples(split)):
            assert torch.equal(sharded.sample(split, i), one.sample(split, i)), (split, i)


def test_a_shard_folder_is_identified_by_its_index_and_shards(prepared):
    _, folder = prepared
    cfg = memmap_cfg(folder).data
    recorded = data_identity(cfg)
    assert recorded["path"] == str(folder) and recorded["shards"] == len(json.loads(
        (folder / "index.json").read_text())["shards"])
    assert data_changes(recorded, cfg) == ""
    shard = folder / "shard-00003.bin"
    data = bytearray(shard.read_bytes())
    data[10] ^= 1
    shard.write_bytes(bytes(data))
    assert data_changes(recorded, cfg).startswith(f"{folder}: its sampled blocks differ")
