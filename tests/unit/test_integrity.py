"""What is on disk stays trustworthy: no checkpoint of a non-finite state, metrics.jsonl history that survives a
bad line, partial and corrupt checkpoint folders told apart (and cleaned or refused), a full disk named in one
line, pruning that keeps the save just made."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from helpers.checkpoint_reads import float_tensors, names, write_metrics  # noqa: F401

from llmtrain.checkpoint import store
from llmtrain.checkpoint.resume import resolve_resume
from llmtrain.rundir.metrics_file import keep_rows_until, read_metrics
from llmtrain.train.metrics import MetricsWriter


# ---- helpers ---------------------------------------------------------------------------------------------------


def fake_checkpoint(run: Path, name: str, meta: bool = True) -> Path:
    """A checkpoint folder with DCP-like files and (meta=True) a manifest as the trainer writes it."""
    path = run / "checkpoints" / name
    path.mkdir(parents=True)
    (path / ".metadata").write_bytes(b"index")
    (path / "__0_0.distcp").write_bytes(b"x" * 100)
    if meta:
        step = int(name[5:12])
        (path / "meta.json").write_text(json.dumps({"step": step, "files": store.file_manifest(str(path))}))
    return path


# ---- 1. the non-finite guard never checkpoints a poisoned state -------------------------------------------------


def _guard(last_good):
    """A Trainer reduced to what the non-finite guard reads."""
    from llmtrain.train.trainer import StepResult, Trainer

    trainer = Trainer.__new__(Trainer)
    trainer.cfg = SimpleNamespace(train=SimpleNamespace(max_bad_steps=3))
    trainer.scaler = SimpleNamespace(enabled=False)
    trainer.ckpt = SimpleNamespace(last_good=last_good)
    trainer.state, trainer.bad_steps, trainer.bad_since = SimpleNamespace(step=0), 0, None

    def step(skipped: bool) -> None:
        trainer.state.step += 1
        trainer._check_bad_step(StepResult(loss=0.0, grad_norm=0.0, skipped=skipped))

    return trainer, step


def test_the_stop_message_names_the_checkpoint_to_go_back_to():
    trainer, step = _guard(("/run/checkpoints/step-0000004", 4))
    for skipped in (False, False, False, False, True, False):  # a streak that closed again
        step(skipped)
    assert trainer.bad_since is None and trainer.bad_steps == 0
    step(True)
    step(True)
    assert trainer.bad_since == 7 and trainer._unsafe_to_save() == "steps 7-8 were non-finite"
    with pytest.raises(RuntimeError) as e:
        step(True)
    assert str(e.value).endswith("stopping at step 9 without saving; the last good checkpoint is "
                                 "/run/checkpoints/step-0000004")
    # Saved right before the streak: the weights every skipped step failed from.
    trainer, step = _guard(("/run/checkpoints/step-0000002", 2))
    step(False)
    step(False)
    with pytest.raises(RuntimeError, match="the newest checkpoint /run/checkpoints/step-0000002 holds the weights "
                                           "all these steps failed from"):
        for _ in range(3):
            step(True)


# ---- 2. metrics.jsonl: a malformed line costs nothing --------------------------------------------------------------


ROWS = [{"step": s, "loss": 5.0 - s / 10} for s in range(1, 11)]


def test_resume_keeps_a_malformed_line_and_every_row_up_to_the_resumed_step(tmp_path, capsys):
    path = tmp_path / "metrics.jsonl"
    lines = [json.dumps(r) for r in ROWS]
    lines[2] = '{"step": 3, "lo'  # torn by a crash, then the run went on appending
    write_metrics(path, lines)
    keep_rows_until(str(path), 8)
    assert path.read_text() == "".join(line + "\n" for line in lines[:8])  # only the tail past step 8 went
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"llmtrain: warning: {path}: skipped malformed line(s) 3 (left in the file)"]


def test_an_unfinished_last_line_is_cut_and_a_row_missing_its_newline_is_ended(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n" + json.dumps(ROWS[1]) + "\n" + '{"step": 3, "lo')
    keep_rows_until(str(path), 5)
    assert read_metrics(str(path)) == ROWS[:2] and path.read_text().endswith("}\n")
    path.write_text(json.dumps(ROWS[0]) + "\n" + json.dumps(ROWS[1]))
    keep_rows_until(str(path), 5)
    assert path.read_text() == json.dumps(ROWS[0]) + "\n" + json.dumps(ROWS[1]) + "\n"


def test_rows_out_of_order_are_dropped_by_step_not_by_position(tmp_path):
    path = tmp_path / "metrics.jsonl"
    write_metrics(path, [json.dumps(ROWS[0]), json.dumps(ROWS[5]), "garbage", json.dumps(ROWS[1])])
    keep_rows_until(str(path), 3)
    assert path.read_text().splitlines() == [json.dumps(ROWS[0]), "garbage", json.dumps(ROWS[1])]


def test_read_metrics_skips_malformed_lines_with_one_warning(tmp_path, capsys):
    path = tmp_path / "metrics.jsonl"
    write_metrics(path, [json.dumps(ROWS[0]), "{oops", json.dumps(ROWS[1]), "[1, 2]", json.dumps(ROWS[2])])
    with open(path, "a") as f:
        f.write('{"step": 4')  # still being written: skipped quietly
    assert read_metrics(str(path)) == ROWS[:3]
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"llmtrain: warning: {path}: skipped malformed line(s) 2, 4 (left in the file)"]


def test_metrics_deleted_mid_run_are_recreated_with_every_row(tmp_path, capsys):
    path = tmp_path / "metrics.jsonl"
    write_metrics(path, [json.dumps(r) for r in ROWS[:2]])  # an earlier launch's rows, kept by the resume
    writer = MetricsWriter(str(path), keep_until_step=2)
    writer.write(ROWS[2])
    path.unlink()
    writer.write(ROWS[3])
    writer.write(ROWS[4])
    assert read_metrics(str(path)) == ROWS[:5]
    assert capsys.readouterr().out == (f"llmtrain: warning: {path} was deleted during the run; recreated it with "
                                       "the 3 row(s) written so far\n")
    # A file put in its place (an editor's save) is written on, not overwritten.
    path.unlink()
    write_metrics(path, [json.dumps(ROWS[0])])
    writer.write(ROWS[5])
    writer.close()
    assert read_metrics(str(path)) == [ROWS[0], ROWS[5]]
    assert capsys.readouterr().out == (f"llmtrain: warning: {path} was replaced during the run; appending to the "
                                       "new file\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]


# ---- 3. stale partial folders, a full disk ----------------------------------------------------------------------


class _Model(torch.nn.Linear):
    num_stages = 1
    args = SimpleNamespace(tie_embeddings=False)  # what ModelState reads of a model


class _Trainer:
    """What CheckpointManager is handed: a model, its optimizer and a TrainingState."""

    def __init__(self):
        from llmtrain.checkpoint.training_state import TrainingState
        from llmtrain.train.loss_scale import DynamicLossScaler

        self.model = _Model(8, 8)
        self.optimizer = torch.optim.AdamW(self.model.parameters())
        self.state = TrainingState(DynamicLossScaler(1.0, 2.0, 0.5, 10, enabled=False), step=1, samples_seen=8,
                                   tokens_seen=64)


@pytest.fixture
def one_rank(tmp_path):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def manager(run: Path, lines: list[str], trainer: _Trainer | None = None):
    from omegaconf import OmegaConf

    from llmtrain.checkpoint.manager import CheckpointManager

    cfg = OmegaConf.create({"parallel": {"dp": 1, "tp": 1, "pp": 1, "zero": 0, "virtual_stages": 1},
                            "cluster": {"nnodes": 1, "nproc_per_node": 1}, "checkpoint": {"keep": 2},
                            "model": {"d_model": 8}})
    t = trainer or _Trainer()
    return CheckpointManager(cfg, str(run), lambda line, **_: lines.append(line), t.model, t.optimizer, t.state)


def test_a_launch_removes_partial_folders_of_killed_saves(tmp_path, one_rank):
    run = tmp_path / "run"
    fake_checkpoint(run, "step-0000004")
    for name in ("step-0000002.tmp", "step-0000009.tmp"):
        (run / "checkpoints" / name).mkdir()
    lines: list[str] = []
    manager(run, lines)
    assert names(run) == ["step-0000004"]
    assert lines == ["llmtrain: removed 2 partial checkpoint folder(s) left by saves that did not finish: "
                     "step-0000002.tmp, step-0000009.tmp"]


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_a_full_disk_is_one_line_and_keeps_the_previous_checkpoint(asynchronous, tmp_path, one_rank, monkeypatch):
    run = tmp_path / "run"
    trainer, lines = _Trainer(), []
    ckpt = manager(run, lines, trainer)
    ckpt.save(asynchronous=False)
    previous = run / "checkpoints" / "step-0000001"
    real_fsync = os.fsync

    def fsync(fd):  # the disk fills up while DCP writes a shard of step 2
        if os.readlink(f"/proc/self/fd/{fd}").endswith(".distcp") and ".tmp" in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    trainer.state.step = 2
    tmp = run / "checkpoints" / "step-0000002.tmp"
    with pytest.raises(RuntimeError) as e:
        ckpt.save(asynchronous=asynchronous)
        ckpt.wait()
    assert str(e.value) == f"no space left on device writing checkpoint step 2 at {tmp}"
    assert names(run) == ["step-0000001"]
    store.verify(str(previous))


# ---- 4. a step folder without its manifest is corrupt, not incomplete -------------------------------------------


def test_a_step_folder_without_meta_json_is_refused_not_skipped(tmp_path):
    run = tmp_path / "run"
    fake_checkpoint(run, "step-0000003", meta=False)  # older than the newest complete one: no obstacle
    fake_checkpoint(run, "step-0000005")
    assert resolve_resume(str(run), "auto").checkpoint == str(run / "checkpoints" / "step-0000005")
    lost = fake_checkpoint(run, "step-0000010", meta=False)
    (run / "checkpoints" / "step-0000012.tmp").mkdir()
    with pytest.raises(store.CheckpointError) as e:
        resolve_resume(str(run), "auto")
    assert e.value.key == str(lost) and e.value.message.startswith("corrupt checkpoint: meta.json is missing")
    with pytest.raises(store.CheckpointError) as e:
        resolve_resume(str(run), str(lost))
    assert e.value.key == str(lost) and "corrupt" in e.value.message


def test_check_covers_shards_index_and_sizes(tmp_path):
    run = tmp_path / "run"
    path = fake_checkpoint(run, "step-0000005")
    info = store.list_checkpoints(str(run))[0]
    assert store.check(info) is None
    (path / "__0_0.distcp").write_bytes(b"x" * 99)
    assert store.check(info) == "__0_0.distcp: checkpoint file is truncated or altered: 99 bytes, 100 written"
    (path / "__0_0.distcp").unlink()
    assert store.check(info) == "__0_0.distcp: checkpoint file is missing"
    (path / ".metadata").unlink()
    assert store.check(info) == ".metadata: DCP's index of the shards is missing"


# ---- 5. pruning keeps the checkpoint just saved -----------------------------------------------------------------


def test_prune_never_removes_the_checkpoint_just_saved(tmp_path):
    run = tmp_path / "run"
    for name in ("step-0000030", "step-0000040"):  # an earlier attempt that got further
        fake_checkpoint(run, name)
    fake_checkpoint(run, "step-0000005", meta=False)  # corrupt: left for the user to look at
    (run / "checkpoints" / "step-0000008.tmp").mkdir()  # older than the newest complete: a dead save
    saved = fake_checkpoint(run, "step-0000010")
    removed = store.prune(str(run), keep=2, protect=str(saved))
    assert removed == [str(run / "checkpoints" / n) for n in ("step-0000030", "step-0000008.tmp")]
    assert names(run) == ["step-0000005", "step-0000010", "step-0000040"]
    store.prune(str(run), keep=1, protect=str(saved))
    assert names(run) == ["step-0000005", "step-0000010"]


def test_prune_without_a_protected_one_keeps_the_newest(tmp_path):
    run = tmp_path / "run"
    for step in (2, 4, 6):
        fake_checkpoint(run, f"step-{step:07d}")
    assert store.prune(str(run), keep=2) == [str(run / "checkpoints" / "step-0000002")]
    assert names(run) == ["step-0000004", "step-0000006"]


def test_the_finiteness_check_before_a_save_sees_one_bad_element():
    import torch

    from llmtrain.train.trainer import nonfinite_flag

    good = [torch.randn(3, 4), torch.zeros(0), torch.full((5,), 1e30)]
    assert nonfinite_flag(good).tolist() == [0.0] and nonfinite_flag([]).tolist() == [0.0]
    for bad in (float("inf"), float("-inf"), float("nan")):
        t = torch.randn(1000)
        t[637] = bad
        assert nonfinite_flag([*good, t]).tolist() == [1.0], bad
