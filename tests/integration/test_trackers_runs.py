"""Trackers on real launches: W&B offline (metrics, config, sweep group, resume), MLflow's local store, a failed launch ending the runs as failed."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from conftest import SMALL, read_rows, run_cli
from helpers.tracker_stores import _mlflow, _offline_env, _wandb_runs  # noqa: F401

from llmtrain.train.trackers.run_ids import read_run_ids


ONE = [*SMALL, "cluster.nproc_per_node=1", "train.global_batch_size=8", "train.micro_batch_size=8"]


def _launch(run_dir: Path, *overrides: str, env: dict, ok: bool = True):
    result = run_cli(["launch", f"run.dir={run_dir}", *ONE, *overrides], cwd=run_dir.parent, env=env)
    if ok:
        assert result.returncode == 0, f"launch failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


def _losses(run_dir: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_rows(run_dir) if "loss" in r}


@pytest.fixture(scope="module")
def resumed_run(tmp_path_factory):
    """One run with both trackers on: 3 steps, then a second launch into the same run dir resumes it to 5."""
    pytest.importorskip("wandb", reason="the wandb extra is not installed")
    pytest.importorskip("mlflow", reason="the mlflow extra is not installed")
    tmp = tmp_path_factory.mktemp("trackers")
    run_dir = tmp / "run"
    env = _offline_env(tmp, LLMTRAIN_SWEEP_NAME="lr-sweep")
    on = ["logging.wandb=true", "logging.mlflow=true", "logging.wandb_tags=[tiny,cpu]", "run.name=tracked"]
    _launch(run_dir, *on, "train.max_steps=3", env=env)
    first = {"ids": read_run_ids(run_dir), "losses": _losses(run_dir),
             "config": yaml.safe_load((run_dir / "config.yaml").read_text())}
    _launch(run_dir, *on, "train.max_steps=5", env=env)
    return run_dir, first


@pytest.mark.slow
def test_wandb_offline_run_holds_the_metrics_config_and_sweep_group(resumed_run):
    run_dir, launched = resumed_run
    first, second = _wandb_runs(run_dir)
    assert first["id"] == launched["ids"]["wandb"]
    assert (first["name"], first["group"], first["project"], first["tags"]) == ("tracked", "lr-sweep", "llmtrain",
                                                                               ["tiny", "cpu"])
    # The run config is the resolved config the launch wrote to RUN_DIR/config.yaml.
    assert first["config"] == launched["config"]
    assert first["config"]["model"]["d_model"] == 64 and first["config"]["train"]["max_steps"] == 3
    assert sorted(first["history"]) == [1, 2, 3]
    assert first["history"][3]["train/loss"] == pytest.approx(launched["losses"][3], abs=1e-6)
    assert "train/step" not in first["history"][3]
    assert first["exit_code"] == 0


@pytest.mark.slow
def test_wandb_resume_continues_the_same_run(resumed_run):
    run_dir, _ = resumed_run
    first, second = _wandb_runs(run_dir)
    assert second["id"] == first["id"] == read_run_ids(run_dir)["wandb"]
    assert second["config"]["train"]["max_steps"] == 5
    assert sorted(second["history"]) == [4, 5]
    assert second["history"][5]["train/loss"] == pytest.approx(_losses(run_dir)[5], abs=1e-6)
    assert second["exit_code"] == 0


@pytest.mark.slow
def test_mlflow_local_store_holds_the_metrics_and_params(resumed_run):
    run_dir, launched = resumed_run
    client, runs = _mlflow(run_dir)
    (run,) = runs  # the resumed launch logged into the same run
    assert run.info.run_id == launched["ids"]["mlflow"] == read_run_ids(run_dir)["mlflow"]
    assert run.info.run_name == "tracked" and run.info.status == "FINISHED"
    assert run.data.tags["llmtrain.sweep"] == "lr-sweep"
    params = run.data.params
    assert params["model.d_model"] == "64" and params["train.max_steps"] == "3"  # a param keeps its first value
    assert params["logging.wandb_tags"] == '["tiny", "cpu"]'
    history = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "train/loss")}
    assert sorted(history) == [1, 2, 3, 4, 5]
    assert history[3] == pytest.approx(launched["losses"][3], abs=1e-6)
    assert history[5] == pytest.approx(_losses(run_dir)[5], abs=1e-6)


@pytest.mark.slow
def test_failed_launch_ends_the_tracker_runs_as_failed(tmp_path):
    pytest.importorskip("wandb", reason="the wandb extra is not installed")
    pytest.importorskip("mlflow", reason="the mlflow extra is not installed")
    run_dir = tmp_path / "run"
    # An inf gradient at step 2 with max_bad_steps=1 stops the run with an error.
    env = _offline_env(tmp_path, LLMTRAIN_INJECT_NONFINITE="2:0")
    result = _launch(run_dir, "logging.wandb=true", "logging.mlflow=true", "train.max_steps=4",
                     "train.max_bad_steps=1", env=env, ok=False)
    assert result.returncode != 0
    _, (run,) = _mlflow(run_dir)
    assert run.info.status == "FAILED"
    (wandb_run,) = _wandb_runs(run_dir)
    assert wandb_run["exit_code"] == 1 and sorted(wandb_run["history"]) == [1]
