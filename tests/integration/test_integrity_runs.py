"""Integrity through real launches: non-finite streaks never checkpointed, a corrupted metrics line and stale
partial folders surviving a resume, a full disk, checkpoints that lost their manifest or a shard. A run whose
launcher is not under test trains in-process (helpers.inprocess_run)."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from conftest import SMALL, run_cli
from helpers.inprocess_run import train_in_process as train
from helpers.checkpoint_reads import float_tensors, names, write_metrics  # noqa: F401

from llmtrain.checkpoint import store
from llmtrain.rundir.metrics_file import read_metrics


BASE = SMALL + ["data=synthetic", "train.global_batch_size=8", "train.micro_batch_size=2"]


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


@pytest.mark.slow
def test_a_non_finite_streak_is_never_checkpointed_and_the_good_one_resumes(tmp_path):
    run = tmp_path / "run"
    common = [*BASE, "train.max_steps=20", "cluster.nproc_per_node=2"]
    train(run, *common, "train.stop_at_step=2")
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
    train(run, *common, "train.stop_at_step=6")
    losses = {r["step"]: r["loss"] for r in read_metrics(str(run / "metrics.jsonl")) if "loss" in r}
    assert sorted(losses) == [1, 2, 3, 4, 5, 6]
    assert all(v is not None and math.isfinite(v) for v in losses.values()), losses


@pytest.mark.slow
def test_a_streak_open_at_the_end_skips_the_final_save(tmp_path, monkeypatch):
    run = tmp_path / "run"
    monkeypatch.setenv("LLMTRAIN_INJECT_NONFINITE", "3:0,6:1")
    train(run, *BASE, "train.max_steps=6", "checkpoint.interval=2", "cluster.nproc_per_node=2")
    # Step 3 was skipped but step 4 was good again: the streak closed, step 4 was saved; step 6 was not.
    assert names(run) == ["step-0000002", "step-0000004"]
    log = rank0_log(run)
    assert (f"llmtrain: step 6: not saving a checkpoint: step 6 was non-finite (the last good checkpoint is "
            f"{run / 'checkpoints' / 'step-0000004'})") in log
    assert log.count("not saving a checkpoint") == 1


@pytest.mark.slow
def test_a_corrupted_metrics_line_and_stale_partials_survive_a_resume(tmp_path):
    run = tmp_path / "run"
    common = [*BASE, "cluster.nproc_per_node=1", "checkpoint.interval=4", "checkpoint.keep=5"]
    train(run, *common, "train.max_steps=10", "checkpoint.at_end=false")
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


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("saved") / "run"
    train(run, *BASE, "cluster.nproc_per_node=1", "train.max_steps=4", "checkpoint.interval=2",
          "checkpoint.keep=5")
    return run


def _refused(run: Path, needle: str) -> str:
    """Launch over a damaged checkpoint: exit 1 (a failure, not bad input) with one line containing `needle`, before
    anything started."""
    before = {p: p.read_bytes() for p in [run / "metrics.jsonl", run / "logs" / "rank0.log"]}
    result = run_cli(["launch", f"run.dir={run}", *BASE, "cluster.nproc_per_node=1", "train.max_steps=6",
                      "checkpoint.interval=2", "checkpoint.keep=5"])
    assert result.returncode == 1, result.stdout[-2000:]
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
