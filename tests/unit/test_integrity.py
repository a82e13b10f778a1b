"""What is on disk stays trustworthy: no checkpoint of a non-finite state, metrics.jsonl history that survives a
bad line, partial and corrupt checkpoint folders told apart (and cleaned or refused), a full disk named in one
line, pruning that keeps the save just made."""

from __future__ import annotations

import errno
import json
import math
import os
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import SMALL, launch, run_cli

from llmtrain.checkpoint import store
from llmtrain.rundir.metrics_file import keep_rows_until, read_metrics
from llmtrain.train.metrics import MetricsWriter

BASE = SMALL + ["data=synthetic", "train.global_batch_size=8", "train.micro_batch_size=2"]


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


def names(run: Path) -> list[str]:
    return sorted(p.name for p in (run / "checkpoints").iterdir())


def float_tensors(state, prefix=""):
    for key, value in state.items():
        if isinstance(value, dict):
            yield from float_tensors(value, f"{prefix}{key}.")
        elif torch.is_tensor(value) and value.is_floating_point():
            yield f"{prefix}{key}", value


def assert_finite_checkpoint(path: Path, scratch: Path) -> None:
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    out = scratch / f"{path.name}.pt"
    dcp_to_torch_save(str(path), str(out))
    tensors = dict(float_tensors(torch.load(out, weights_only=False)))
    assert any(k.startswith("model.") for k in tensors)
    bad = [k for k, t in tensors.items() if not torch.isfinite(t).all()]
    assert not bad, f"{path}: non-finite {bad[:5]}"


def rank0_log(run: Path) -> str:
    return (run / "logs" / "rank0.log").read_text()


# ---- 1. the non-finite guard never checkpoints a poisoned state -------------------------------------------------


@pytest.mark.slow
def test_a_non_finite_streak_is_never_checkpointed_and_the_good_one_resumes(tmp_path):
    run = tmp_path / "run"
    common = [*BASE, "train.max_steps=20", "cluster.nproc_per_node=2"]
    launch(run, *common, "train.stop_at_step=2")
    good = run / "checkpoints" / "step-0000002"
    # lr=1e9: step 3's update is finite but blows the weights up; from step 4 on every step is non-finite.
    result = run_cli(["launch", f"run.dir={run}", *common, "train.lr=1e9", "checkpoint.interval=5",
                      "train.max_bad_steps=6"])
    assert result.returncode != 0
    log = rank0_log(run)
    assert (f"llmtrain: step 5: not saving a checkpoint: steps 4-5 were non-finite (the last good checkpoint is "
            f"{good})") in log, log[-3000:]
    assert f"6 consecutive non-finite steps (train.max_bad_steps=6); stopping at step 9 without saving; the last " \
           f"good checkpoint is {good}" in log
    assert names(run) == ["step-0000002"]
    for path in (run / "checkpoints").iterdir():
        assert_finite_checkpoint(path, tmp_path)
    # The newest checkpoint really is a good state: with a sane lr training goes on with finite losses.
    launch(run, *common, "train.stop_at_step=6")
    losses = {r["step"]: r["loss"] for r in read_metrics(str(run / "metrics.jsonl")) if "loss" in r}
    assert sorted(losses) == [1, 2, 3, 4, 5, 6]
    assert all(v is not None and math.isfinite(v) for v in losses.values()), losses


@pytest.mark.slow
def test_a_streak_open_at_the_end_skips_the_final_save(tmp_path):
    run = tmp_path / "run"
    result = run_cli(["launch", f"run.dir={run}", *BASE, "train.max_steps=6", "checkpoint.interval=2",
                      "cluster.nproc_per_node=2"], env={"LLMTRAIN_INJECT_NONFINITE": "3:0,6:1"})
    assert result.returncode == 0, result.stdout[-3000:]
    # Step 3 was skipped but step 4 was good again: the streak closed, step 4 was saved; step 6 was not.
    assert names(run) == ["step-0000002", "step-0000004"]
    log = rank0_log(run)
    assert (f"llmtrain: step 6: not saving a checkpoint: step 6 was non-finite (the last good checkpoint is "
            f"{run / 'checkpoints' / 'step-0000004'})") in log
    assert log.count("not saving a checkpoint") == 1


def _guard(last_good):
    """A Trainer reduced to what the non-finite guard reads."""
    from llmtrain.train.trainer import StepResult, Trainer

    trainer = Trainer.__new__(Trainer)
    trainer.cfg = SimpleNamespace(train=SimpleNamespace(max_bad_steps=3))
    trainer.scaler = SimpleNamespace(enabled=False)
    trainer.ckpt = SimpleNamespace(last_good=last_good)
    trainer.step, trainer.bad_steps, trainer.bad_since = 0, 0, None

    def step(skipped: bool) -> None:
        trainer.step += 1
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


def write_metrics(path: Path, lines: list[str]) -> None:
    path.write_text("".join(line + "\n" for line in lines))


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


@pytest.mark.slow
def test_a_corrupted_metrics_line_and_stale_partials_survive_a_resume(tmp_path):
    run = tmp_path / "run"
    common = [*BASE, "cluster.nproc_per_node=1", "checkpoint.interval=4", "checkpoint.keep=5"]
    launch(run, *common, "train.max_steps=10", "checkpoint.at_end=false")
    metrics = run / "metrics.jsonl"
    lines = metrics.read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == list(range(1, 11))
    lines[2] = lines[2][: len(lines[2]) // 2]
    write_metrics(metrics, lines)
    kept = "".join(line + "\n" for line in lines[:8])  # up to step 8, the newest checkpoint
    # Leftovers of saves that were killed, one older and one newer than the newest complete checkpoint.
    for name in ("step-0000005.tmp", "step-0000011.tmp"):
        (run / "checkpoints" / name).mkdir()
    result = run_cli(["launch", f"run.dir={run}", *common, "train.max_steps=12"])
    assert result.returncode == 0, result.stdout[-3000:]
    text = metrics.read_text()
    assert text.startswith(kept), text[:2000]
    assert [r["step"] for r in read_metrics(str(metrics))] == [1, 2, *range(4, 13)]
    log = rank0_log(run)
    assert f"llmtrain: warning: {metrics}: skipped malformed line(s) 3 (left in the file)" in log
    assert ("llmtrain: removed 2 partial checkpoint folder(s) left by saves that did not finish: "
            "step-0000005.tmp, step-0000011.tmp") in log
    assert names(run) == ["step-0000004", "step-0000008", "step-0000012"]
    report = run_cli(["report", str(run)], timeout=120)
    assert report.returncode == 0, report.stderr
    assert f"{metrics}: skipped malformed line(s) 3" in report.stderr


# ---- 3. stale partial folders, a full disk ----------------------------------------------------------------------


class _Model(torch.nn.Linear):
    num_stages = 1
    args = SimpleNamespace(tie_embeddings=False)  # what ModelState reads of a model


class _Trainer:
    """What CheckpointManager reads of a trainer."""

    def __init__(self):
        from llmtrain.train.loss_scale import DynamicLossScaler

        self.model = _Model(8, 8)
        self.optimizer = torch.optim.AdamW(self.model.parameters())
        self.step, self.samples_seen, self.tokens_seen = 1, 8, 64
        self.scaler = DynamicLossScaler(1.0, 2.0, 0.5, 10, enabled=False)

    def elapsed_s(self) -> float:
        return 1.0


@pytest.fixture
def one_rank(tmp_path):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def manager(run: Path, lines: list[str]):
    from omegaconf import OmegaConf

    from llmtrain.checkpoint.manager import CheckpointManager

    cfg = OmegaConf.create({"parallel": {"dp": 1, "tp": 1, "pp": 1, "zero": 0, "virtual_stages": 1},
                            "cluster": {"nnodes": 1, "nproc_per_node": 1}, "checkpoint": {"keep": 2},
                            "model": {"d_model": 8}})
    return CheckpointManager(cfg, str(run), lambda line, **_: lines.append(line))


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
    ckpt = manager(run, lines)
    ckpt.save(trainer, asynchronous=False)
    previous = run / "checkpoints" / "step-0000001"
    real_fsync = os.fsync

    def fsync(fd):  # the disk fills up while DCP writes a shard of step 2
        if os.readlink(f"/proc/self/fd/{fd}").endswith(".distcp") and ".tmp" in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    trainer.step = 2
    tmp = run / "checkpoints" / "step-0000002.tmp"
    with pytest.raises(RuntimeError) as e:
        ckpt.save(trainer, asynchronous=asynchronous)
        ckpt.wait()
    assert str(e.value) == f"no space left on device writing checkpoint step 2 at {tmp}"
    assert names(run) == ["step-0000001"]
    store.verify(str(previous))


@pytest.mark.slow
def test_a_full_disk_in_a_real_launch_names_the_step_and_folder(tmp_path):
    run = tmp_path / "run"
    mount_point = run / "checkpoints"
    mount_point.mkdir(parents=True)
    # Room for one ~3 MiB checkpoint of this model, not two.
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=5m", "tmpfs", str(mount_point)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"mounting a small tmpfs is not permitted here (needs root): {mounted.stderr.strip()}")
    try:
        result = run_cli(["launch", f"run.dir={run}", *BASE, "cluster.nproc_per_node=1", "train.max_steps=6",
                          "checkpoint.interval=2", "checkpoint.keep=1"])
        assert result.returncode != 0
        message = f"no space left on device writing checkpoint step 4 at {mount_point / 'step-0000004.tmp'}"
        status = json.loads((run / "logs" / "rank0.status").read_text())
        assert status["status"] == "error" and status["error"] == f"RuntimeError: {message}"
        assert message in result.stdout + result.stderr
        assert names(run) == ["step-0000002"]
        store.verify(str(mount_point / "step-0000002"))
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], capture_output=True)


# ---- 4. a step folder without its manifest is corrupt, not incomplete -------------------------------------------


def test_a_step_folder_without_meta_json_is_refused_not_skipped(tmp_path):
    run = tmp_path / "run"
    fake_checkpoint(run, "step-0000003", meta=False)  # older than the newest complete one: no obstacle
    fake_checkpoint(run, "step-0000005")
    assert store.resolve_resume(str(run), "auto")[0] == str(run / "checkpoints" / "step-0000005")
    lost = fake_checkpoint(run, "step-0000010", meta=False)
    (run / "checkpoints" / "step-0000012.tmp").mkdir()
    with pytest.raises(store.CheckpointError) as e:
        store.resolve_resume(str(run), "auto")
    assert e.value.key == str(lost) and e.value.message.startswith("corrupt checkpoint: meta.json is missing")
    with pytest.raises(store.CheckpointError) as e:
        store.resolve_resume(str(run), str(lost))
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


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("saved") / "run"
    launch(run, *BASE, "cluster.nproc_per_node=1", "train.max_steps=4", "checkpoint.interval=2",
           "checkpoint.keep=5")
    return run


def _refused(run: Path, needle: str) -> str:
    """Launch over a damaged run: exit 2 with one line containing `needle`, before anything started."""
    before = {p: p.read_bytes() for p in [run / "metrics.jsonl", run / "logs" / "rank0.log"]}
    result = run_cli(["launch", f"run.dir={run}", *BASE, "cluster.nproc_per_node=1", "train.max_steps=6",
                      "checkpoint.interval=2", "checkpoint.keep=5"])
    assert result.returncode == 2, result.stdout[-2000:]
    err = result.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("llmtrain: error: ") and needle in err[0], result.stderr
    assert "run directory" not in result.stdout  # no job was started
    assert all(p.read_bytes() == data for p, data in before.items())
    return err[0]


def _listed(run: Path) -> tuple[dict[str, str], str]:
    """`ckpt list`: {step: state} and the whole output."""
    result = run_cli(["ckpt", "list", str(run)], timeout=120)
    assert result.returncode == 0, result.stderr
    states = {}
    for line in result.stdout.splitlines():
        for step in ("2", "4", "6"):
            if f"step-000000{step}" in line:
                cells = [c.strip() for c in line.strip("│┃ ").split("│")]
                states[step] = cells[1]
    return states, result.stdout


@pytest.mark.slow
def test_launch_and_list_name_a_checkpoint_that_lost_its_meta_json(saved_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(saved_run, run)
    lost = run / "checkpoints" / "step-0000004"
    (lost / "meta.json").unlink()
    line = _refused(run, f"{lost}: corrupt checkpoint: meta.json is missing")
    assert "renamed from .tmp" in line
    (run / "checkpoints" / "step-0000006.tmp").mkdir()
    states, out = _listed(run)
    assert states == {"2": "complete", "4": "corrupt (meta.json missing or unreadable)",
                      "6": "incomplete (.tmp: save did not finish)"}
    assert "checked: meta.json, .metadata, each file present with its written size" in out


@pytest.mark.slow
def test_launch_and_list_name_a_missing_shard(saved_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(saved_run, run)
    shard = next((run / "checkpoints" / "step-0000004").glob("*.distcp"))
    shard.unlink()
    _refused(run, f"{shard}: checkpoint file is missing")
    assert _listed(run)[0] == {"2": "complete", "4": f"corrupt ({shard.name}: checkpoint file is missing)"}


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
