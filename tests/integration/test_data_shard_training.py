"""Training with data=memmap on a folder of shards gives the losses of training on the same tokens prepared as one
file (in-process: what the data feed reads is under test, not the launcher)."""

from __future__ import annotations

import pytest
from conftest import SMALL
from helpers.corpus_files import write_corpus
from helpers.inprocess_run import train_in_process

from llmtrain.data.corpus import prepare_corpus

pytestmark = pytest.mark.slow
ONE = [*SMALL, "cluster.nproc_per_node=1", "train.global_batch_size=8", "train.micro_batch_size=4",
       "checkpoint.at_end=false", "train.max_steps=4", "train.eval_interval=2", "train.eval_steps=2"]


def test_a_shard_folder_trains_like_the_same_tokens_in_one_file(tmp_path):
    corpus = write_corpus(tmp_path / "in", files=4, words=3000)
    prepare_corpus([str(corpus)], str(tmp_path / "one.bin"))
    prepare_corpus([str(corpus)], str(tmp_path / "shards"), shard_tokens=999)  # windows span shards
    rows = {}
    for name in ("one.bin", "shards"):
        rows[name] = train_in_process(tmp_path / f"run-{name}", *ONE, "data=memmap",
                                      f"data.path={tmp_path / name}")
    losses = {name: [(r["step"], r["loss"]) for r in got if "loss" in r] for name, got in rows.items()}
    val = {name: [(r["step"], r["val_loss"]) for r in got if "val_loss" in r] for name, got in rows.items()}
    assert [step for step, _ in losses["one.bin"]] == [1, 2, 3, 4]
    assert [step for step, _ in val["one.bin"]] == [2, 4]
    assert losses["shards"] == losses["one.bin"] and val["shards"] == val["one.bin"]
