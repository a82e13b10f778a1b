"""What keeps two runs, a failing tidy-up and a shared filesystem store from losing checkpoints: a location names
the run it belongs to; the upload thread outlives a failure after its commit; an upload to a filesystem store goes
through STEP.tmp like a save; a fast-tier checkpoint that not every rank sees whole is not loaded."""

from __future__ import annotations

import os

from test_checkpoint_storage import write_checkpoint
from test_integrity import _Trainer
from omegaconf import OmegaConf

from llmtrain.checkpoint import store
from llmtrain.checkpoint.location import Tiers
from llmtrain.checkpoint.ownership import OWNER, claim, other_run, owner_of
from llmtrain.checkpoint.resume import resolve_resume
from llmtrain.checkpoint.upload import Uploader
from llmtrain.cli import main


def test_a_location_names_its_run_and_another_run_is_refused_there(tmp_path, s3):
    location = f"s3://{s3.bucket('owner')}/runs/a"
    assert owner_of(location) is None and other_run(location, "/runs/a") is None
    claim(location, "/runs/a")
    assert owner_of(location) == "/runs/a" and other_run(location, "/runs/a") is None
    why = other_run(location, "/runs/b")
    assert why == (f"{location} holds the checkpoints of the run in /runs/a; give this run its own location (e.g. "
                   f"{location}-2), or resume from one of them with checkpoint.resume=PATH and another location; "
                   f"if /runs/a moved to /runs/b, remove {location}/{OWNER}")


def test_a_launch_into_another_run_s_checkpoint_dir_is_refused_before_anything_starts(tmp_path, s3, capsys):
    location = f"s3://{s3.bucket('owner')}/shared"
    claim(location, str(tmp_path / "first"))
    code = main(["launch", "--dry-run", f"run.dir={tmp_path / 'second'}", f"checkpoint.dir={location}"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith(f"llmtrain: error: checkpoint.dir: {location} holds the checkpoints of the "
                                        f"run in {tmp_path / 'first'}; "), err
    assert not (tmp_path / "second").exists()


def test_the_upload_thread_outlives_a_failure_after_its_commit(tmp_path, monkeypatch):
    target = str(tmp_path / "store")  # a filesystem store: uploads go through STEP.tmp and a rename
    lines: list[str] = []
    uploader = Uploader(target, keep=2, log=lambda line, **_: lines.append(line))
    real_prune = store.prune

    def prune_fails_once(*args, **kwargs):
        monkeypatch.setattr(store, "prune", real_prune)
        raise OSError("the store's listing failed")

    monkeypatch.setattr(store, "prune", prune_fails_once)
    uploader.submit(write_checkpoint(str(tmp_path / "fast"), 1), 1)
    uploader.submit(write_checkpoint(str(tmp_path / "fast"), 2), 2)  # waits for the first
    uploader.finish()
    assert lines[0] == (f"llmtrain: uploaded checkpoint step 1 -> {target}/step-0000001 (0.0 MiB, "
                        f"{lines[0].split(', ')[1].split(')')[0]}); warning: tidying the store afterwards failed "
                        "(OSError: the store's listing failed)"), lines
    assert lines[1].startswith(f"llmtrain: uploaded checkpoint step 2 -> {target}/step-0000002 "), lines
    assert [(i.step, i.complete, i.partial) for i in store.list_checkpoints(Tiers(target))] == [
        (1, True, False), (2, True, False)]
    assert uploader.held() == ()


def test_an_upload_cut_off_on_a_filesystem_store_is_partial_not_corrupt(tmp_path, monkeypatch):
    target = str(tmp_path / "store")
    write_checkpoint(target, 3)
    local = write_checkpoint(str(tmp_path / "fast"), 5)
    lines: list[str] = []
    uploader = Uploader(target, keep=2, log=lambda line, **_: lines.append(line))
    monkeypatch.setattr("llmtrain.checkpoint.upload.FINAL_TRIES", 1)
    monkeypatch.setattr("llmtrain.checkpoint.upload.BACKOFF_S", (0,))
    put = uploader.storage.put_file
    calls = []

    def cut_after_one_file(src: str, dst: str) -> None:
        calls.append(dst)
        if len(calls) > 1:
            raise OSError("connection cut")
        put(src, dst)

    monkeypatch.setattr(uploader.storage, "put_file", cut_after_one_file)
    uploader.submit(local, 5)
    uploader.finish()
    assert "giving up" in lines[-1], lines
    assert os.path.isdir(f"{target}/step-0000005.tmp") and not os.path.exists(f"{target}/step-0000005")
    # The half upload is a .tmp folder: ignored (and named) by resume, never called corrupt.
    resolution = resolve_resume(Tiers(target), "auto")
    assert resolution.checkpoint == f"{target}/step-0000003"
    assert [i.path for i in resolution.ignored] == [f"{target}/step-0000005.tmp"]


def test_a_fast_tier_checkpoint_not_whole_on_every_rank_loads_the_store_s_newest(tmp_path, one_rank):
    from llmtrain.checkpoint.manager import CheckpointManager

    store_dir, local_dir = tmp_path / "store", tmp_path / "local"
    lines: list[str] = []
    cfg = OmegaConf.create({"parallel": {"dp": 1, "tp": 1, "pp": 1, "zero": 0, "virtual_stages": 1},
                            "cluster": {"nnodes": 1, "nproc_per_node": 1}, "model": {"d_model": 8},
                            "train": {"max_steps": 10}, "checkpoint": {"keep": 2, "dir": str(store_dir),
                                                                       "local_dir": str(local_dir),
                                                                       "upload_every": 3}})
    trainer = _Trainer()
    ckpt = CheckpointManager(cfg, str(tmp_path / "run"), lambda line, **_: lines.append(line), trainer.model,
                             trainer.optimizer, trainer.state)
    ckpt.save(asynchronous=False)  # step 1: in the fast tier, and in the store as the newest at finish()
    ckpt.finish()
    trainer.state.step = 2
    ckpt.save(asynchronous=False)  # step 2: not due for upload (every 3rd), in the fast tier only
    newest = local_dir / "step-0000002"
    (newest / "__0_0.distcp").unlink()  # as on a node that holds only its own ranks' shards
    assert ckpt._readable_by_every_rank(str(newest)) == str(store_dir / "step-0000001")
    assert lines[-1] == (f"llmtrain: {newest} is not on every node's disk (checkpoint.local_dir); resuming from "
                         f"{store_dir / 'step-0000001'} instead")
    assert ckpt._readable_by_every_rank(str(local_dir / "step-0000001")) == str(local_dir / "step-0000001")
