"""Experiment trackers: W&B (offline) and MLflow (its local store) receive every metrics row, a resumed run
continues the same tracker runs, a failing tracker only costs a warning, and a missing package is refused before
launch in one line."""

from __future__ import annotations

import pytest
from conftest import read_rows
from helpers.tracker_stores import _mlflow, _offline_env, _wandb_runs  # noqa: F401

from llmtrain.config import ConfigError, compose_config
from llmtrain.launch.config_probes import validate_here
from llmtrain.train.metrics import MetricsWriter
from llmtrain.train.trackers import requirements
from llmtrain.train.trackers.base import Tracker, scalars
from llmtrain.train.trackers.fanout import open_trackers
from llmtrain.train.trackers.run_ids import FILE, read_run_ids, write_run_ids


@pytest.fixture(autouse=True)
def _no_wandb_service_left():
    """wandb run in this process starts a service process as its child; a later test's launcher would count it
    among its own processes."""
    yield
    import sys

    if "wandb" in sys.modules:
        sys.modules["wandb"].teardown()


def _missing(package: str) -> str:
    return (f"needs the {package} package, which is not installed: pip install 'llmtrain[{package}]' "
            f"(in a checkout: pip install -e '.[{package}]')")


# ---------------------------------------------------------------------------------------------- reading W&B files





# ------------------------------------------------------------------------------------------ end to end, both runs


# ---------------------------------------------------------------------------------------------- in one process

class _Recorder(Tracker):
    name, key, title = "recorder", "logging.recorder", "Recorder"

    def __init__(self, fail_at: str | None = None):
        self.fail_at, self.rows, self.status = fail_at, [], None

    def start(self, config, run_dir, resume_id):
        if self.fail_at == "start":
            raise ConnectionError("network is unreachable\nmore detail")
        self.config, self.resume_id = config, resume_id
        return resume_id or "run-1"

    def log(self, row):
        if self.fail_at == "log" and row["step"] == 2:
            raise TimeoutError("no answer")
        self.rows.append(row)

    def finish(self, status):
        self.status = status


class _Broken(_Recorder):
    name, title = "broken", "Broken"


def test_failing_trackers_cost_one_warning_each_and_training_rows_go_on(tmp_path, capsys):
    cfg = compose_config([f"run.dir={tmp_path}"])
    good, at_log, at_start = _Recorder(), _Broken("log"), _Broken("start")
    at_start.name = "down"
    trackers = open_trackers(cfg, str(tmp_path), resumed=False, trackers=[at_start, good, at_log])
    writer = MetricsWriter(str(tmp_path / "metrics.jsonl"), trackers=trackers)
    for step in (1, 2, 3):
        writer.write({"step": step, "loss": 5.0 - step, "lr": float("nan")})
    writer.close()
    writer.close()  # a second close changes nothing
    out = capsys.readouterr().out.splitlines()
    assert out == [
        "llmtrain: warning: Broken failed to start its run (ConnectionError: network is unreachable); Broken "
        "logging is off for the rest of this launch",
        "llmtrain: warning: Broken failed to log step 2 (TimeoutError: no answer); Broken logging is off for the "
        "rest of this launch",
    ]
    assert [r["step"] for r in read_rows(tmp_path)] == [1, 2, 3]
    assert [r["step"] for r in good.rows] == [1, 2, 3] and good.rows[0]["lr"] is None
    assert good.status == "finished" and at_log.status is None
    assert good.config["run"]["dir"] == str(tmp_path)
    assert read_run_ids(str(tmp_path)) == {"recorder": "run-1", "broken": "run-1"}  # not the one that never started


def test_resumed_launch_hands_each_tracker_its_run_id(tmp_path):
    cfg = compose_config([f"run.dir={tmp_path}"])
    write_run_ids(str(tmp_path), {"recorder": "abc", "other": "kept"})
    fresh, resumed = _Recorder(), _Recorder()
    open_trackers(cfg, str(tmp_path), resumed=False, trackers=[fresh]).finish("failed")
    assert fresh.resume_id is None and fresh.status == "failed"
    assert read_run_ids(str(tmp_path)) == {"recorder": "run-1"}  # a fresh start records only its own runs
    write_run_ids(str(tmp_path), {"recorder": "abc", "other": "kept"})
    open_trackers(cfg, str(tmp_path), resumed=True, trackers=[resumed])
    assert resumed.resume_id == "abc"
    assert read_run_ids(str(tmp_path)) == {"recorder": "abc", "other": "kept"}
    assert not (tmp_path / f"{FILE}.tmp").exists()
    (tmp_path / FILE).write_text("{not json")
    assert read_run_ids(str(tmp_path)) == {}
    assert open_trackers(cfg, str(tmp_path), resumed=True) is None  # none enabled: nothing started


def test_scalars_use_tensorboards_names():
    assert scalars({"step": 5, "loss": 2.5, "lr": 1e-3, "mfu": None, "bad": float("inf"), "skip": True}) == \
        {"train/loss": 2.5, "train/lr": 1e-3}
    assert scalars({"step": 5, "val_loss": 2.25}) == {"val/loss": 2.25}


def test_mlflow_params_respect_its_limits(tmp_path):
    pytest.importorskip("mlflow", reason="the mlflow extra is not installed")
    from mlflow.entities import Param
    from mlflow.tracking import MlflowClient
    from mlflow.utils.validation import MAX_ENTITY_KEY_LENGTH, MAX_PARAM_VAL_LENGTH

    from llmtrain.train.trackers.mlflow_tracker import params

    config = {"env": {"A" * 300: "x", "B:C": "y" * 7000}, "data": {"path": None}, "network": {"env": {}},
              "cluster": {"setup": ["module load cuda", "source venv"]}}
    got = params(config)
    assert got["data.path"] == "None" and got["network.env"] == "{}"
    assert got["cluster.setup"] == '["module load cuda", "source venv"]'
    assert got["env.B_C"] == "y" * (MAX_PARAM_VAL_LENGTH - 3) + "..."
    assert all(len(k) <= MAX_ENTITY_KEY_LENGTH for k in got)
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    run = client.create_run(client.create_experiment("limits"))
    client.log_batch(run.info.run_id, params=[Param(k, v) for k, v in got.items()])  # MLflow takes them all
    assert client.get_run(run.info.run_id).data.params == got


def test_preempted_launch_marks_the_tracker_runs_and_the_next_launch_reopens_them(tmp_path, monkeypatch, capsys):
    pytest.importorskip("wandb", reason="the wandb extra is not installed")
    pytest.importorskip("mlflow", reason="the mlflow extra is not installed")
    for name, value in _offline_env(tmp_path).items():
        monkeypatch.setenv(name, value)
    cfg = compose_config([f"run.dir={tmp_path}", "logging.wandb=true", "logging.mlflow=true"])
    writer = MetricsWriter(str(tmp_path / "metrics.jsonl"), trackers=open_trackers(cfg, str(tmp_path), False))
    writer.write({"step": 1, "loss": 3.5})
    writer.close(status="preempted")
    client, (run,) = _mlflow(tmp_path)
    assert run.info.status == "KILLED"
    writer = MetricsWriter(str(tmp_path / "metrics.jsonl"), keep_until_step=1,
                           trackers=open_trackers(cfg, str(tmp_path), True))
    assert client.get_run(run.info.run_id).info.status == "RUNNING"
    writer.write({"step": 2, "loss": 3.25})
    writer.close()
    assert client.get_run(run.info.run_id).info.status == "FINISHED"
    assert [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "train/loss")] == \
        [(1, 3.5), (2, 3.25)]
    preempted, finished = _wandb_runs(tmp_path)
    assert preempted["id"] == finished["id"]
    assert (preempted["exit_code"], finished["exit_code"]) == (143, 0)
    assert "warning" not in capsys.readouterr().out


def test_mlflow_run_missing_from_the_store_starts_a_new_one(tmp_path, capsys):
    pytest.importorskip("mlflow", reason="the mlflow extra is not installed")
    cfg = compose_config([f"run.dir={tmp_path}", "logging.mlflow=true"])
    write_run_ids(str(tmp_path), {"mlflow": "0123456789abcdef0123456789abcdef"})
    open_trackers(cfg, str(tmp_path), resumed=True).finish("finished")
    _, (run,) = _mlflow(tmp_path)
    assert read_run_ids(str(tmp_path)) == {"mlflow": run.info.run_id}
    assert "llmtrain: MLflow run 0123456789abcdef0123456789abcdef of this run directory is not in sqlite:///" \
           in capsys.readouterr().out


def test_unreachable_mlflow_server_is_a_warning(tmp_path, capsys, monkeypatch):
    pytest.importorskip("mlflow", reason="the mlflow extra is not installed")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    cfg = compose_config([f"run.dir={tmp_path}", "logging.mlflow=true",
                          "logging.mlflow_tracking_uri=http://127.0.0.1:1"])
    trackers = open_trackers(cfg, str(tmp_path), resumed=False)
    assert trackers is not None and trackers.active == []
    trackers.log({"step": 1, "loss": 1.0})
    trackers.finish("finished")
    (line,) = capsys.readouterr().out.splitlines()
    assert line.startswith("llmtrain: warning: MLflow failed to start its run (")
    assert line.endswith("); MLflow logging is off for the rest of this launch")
    assert read_run_ids(str(tmp_path)) == {}


# ------------------------------------------------------------------------------------------------ missing packages

@pytest.mark.parametrize("package", ["wandb", "mlflow"])
def test_missing_package_is_one_line_exit_2_before_launch(package, tmp_path, capsys, monkeypatch):
    from llmtrain.cli import main

    from llmtrain import extras

    real = extras.find_spec
    monkeypatch.setattr(extras, "find_spec", lambda name: None if name == package else real(name))
    validate_here(compose_config([f"logging.{package}=false"]))  # not asked for: nothing needed
    with pytest.raises(ConfigError) as info:
        validate_here(compose_config([f"logging.{package}=true"]))
    assert (info.value.key, info.value.message) == (f"logging.{package}", _missing(package))
    assert main(["launch", "--dry-run", f"logging.{package}=true", f"run.dir={tmp_path / 'run'}"]) == 2
    captured = capsys.readouterr()
    assert captured.err == f"llmtrain: error: logging.{package}: {_missing(package)}\n" and captured.out == ""
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("package", ["wandb", "mlflow"])
def test_installed_package_passes_validation(package):
    pytest.importorskip(package, reason=f"the {package} extra is not installed")
    assert requirements.tracker_missing(f"logging.{package}") is None
    validate_here(compose_config([f"logging.{package}=true"]))
