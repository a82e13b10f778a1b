"""A save straight to an object store (checkpoint.dir=s3://..., no fast tier) that fails: retried after a pause,
then training goes on from the previous checkpoint, except at the last step; nothing half-written is left to be
resumed. In one process (a gloo group of one rank), the store an S3 server behind the fault proxy
(tests/helpers/s3_faults.py), so the failures come through the real client stack."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from llmtrain.checkpoint import save_failures
from llmtrain.checkpoint import store
from llmtrain.checkpoint.manager import CheckpointManager
from llmtrain.errors import CheckpointError

PAUSES_S = (0.05, 0.05, 0.05)


class _Model(torch.nn.Linear):
    num_stages = 1
    args = OmegaConf.create({"tie_embeddings": False})  # what ModelState reads of a model


@pytest.fixture
def saving(s3_faulty, s3_server, one_rank, tmp_path, monkeypatch):
    """(manager, its log lines, the store location, the proxy), the pauses between tries cut short."""
    from llmtrain.checkpoint.training_state import TrainingState
    from llmtrain.train.loss_scale import DynamicLossScaler

    monkeypatch.setattr(save_failures, "STORE_BACKOFF_S", PAUSES_S)
    location = f"s3://{s3_server.bucket('saves')}/run"
    cfg = OmegaConf.create({"parallel": {"dp": 1, "tp": 1, "pp": 1, "zero": 0, "virtual_stages": 1},
                            "cluster": {"nnodes": 1, "nproc_per_node": 1}, "model": {"d_model": 8},
                            "train": {"max_steps": 10}, "checkpoint": {"keep": 2, "dir": location}})
    model = _Model(8, 8)
    state = TrainingState(DynamicLossScaler(1.0, 2.0, 0.5, 10, enabled=False), step=1, samples_seen=8,
                          tokens_seen=64)
    lines: list[str] = []

    def log(line: str, **_) -> None:
        lines.append(line)
        if heal_on_retry and "retrying" in line:  # the store answers again by the next try
            s3_faulty.passthrough()

    heal_on_retry = []
    ckpt = CheckpointManager(cfg, str(tmp_path / "run"), log, model, torch.optim.AdamW(model.parameters()), state)
    return ckpt, lines, location, s3_faulty, heal_on_retry


def steps_in(location: str) -> list[tuple[int, bool]]:
    return [(i.step, i.complete) for i in store.list_checkpoints(location)]


def test_a_save_refused_once_is_tried_again_and_lands_whole(saving):
    ckpt, lines, location, proxy, heal_on_retry = saving
    proxy.deny()
    heal_on_retry.append(True)
    ckpt.save(asynchronous=False)
    assert lines[0].startswith(f"llmtrain: warning: checkpoint step 1 to {location} failed (rank 0: access denied "
                               "(check the credentials and the bucket's policy): "), lines[0]
    assert lines[0].endswith("); retrying in 0.05 s"), lines[0]
    assert lines[1].startswith(f"llmtrain: saved checkpoint step 1 -> {location}/step-0000001 ("), lines
    assert steps_in(location) == [(1, True)]
    store.verify(f"{location}/step-0000001", crc=True)


def test_a_store_that_refuses_every_try_leaves_training_going_and_nothing_half_written(saving):
    ckpt, lines, location, proxy, _ = saving
    ckpt.save(asynchronous=False)  # step 1 lands
    ckpt.state.step = 4
    proxy.deny()
    ckpt.save(asynchronous=False)  # returns: training goes on
    tries = [line for line in lines if "checkpoint step 4" in line]
    assert len(tries) == 4 and all("access denied" in line for line in tries), tries
    assert [line.rsplit(")", 1)[-1] for line in tries[:3]] == ["; retrying in 0.05 s"] * 3
    assert tries[3].endswith(f"; training goes on, the next save tries again; the last good checkpoint: "
                             f"{location}/step-0000001"), tries[3]
    proxy.passthrough()
    assert steps_in(location) == [(1, True)]  # no folder of step 4, not even an incomplete one
    assert ckpt.last_good == (f"{location}/step-0000001", 1)
    ckpt.state.step = 6
    ckpt.save(asynchronous=False)  # the next save is the retry
    assert steps_in(location) == [(1, True), (6, True)]


def test_the_last_step_s_save_must_land(saving):
    ckpt, lines, location, proxy, _ = saving
    ckpt.state.step = 10  # train.max_steps
    proxy.deny()
    with pytest.raises(CheckpointError) as e:
        ckpt.save(asynchronous=False)
    assert e.value.key == f"{location}/step-0000010"
    assert e.value.message.startswith("the last step's checkpoint could not be written after 4 tries (rank 0: ")
    proxy.passthrough()
    assert steps_in(location) == []


def test_a_failed_background_save_is_said_and_the_next_save_is_its_retry(saving):
    ckpt, lines, location, proxy, _ = saving
    proxy.deny()
    ckpt.save(asynchronous=True)
    ckpt.wait()  # training moved on meanwhile: this state is not written again
    failed = [line for line in lines if "failed" in line]
    assert len(failed) == 1, lines
    assert failed[0].startswith(f"llmtrain: warning: checkpoint step 1 to {location} failed ("), lines
    assert failed[0].endswith("training goes on, the next save tries again; the last good checkpoint: none yet")
    proxy.passthrough()
    assert steps_in(location) == [] and ckpt.last_good is None
    ckpt.state.step = 2
    ckpt.save(asynchronous=True)
    ckpt.wait()
    assert steps_in(location) == [(2, True)]
