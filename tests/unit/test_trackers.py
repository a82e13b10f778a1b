"""Experiment trackers: W&B (offline) and MLflow (its local store) receive every metrics row, a resumed run
continues the same tracker runs, a failing tracker only costs a warning, and a missing package is refused before
launch in one line."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import yaml
from conftest import SMALL, read_rows, run_cli

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

ONE = [*SMALL, "cluster.nproc_per_node=1", "train.global_batch_size=8", "train.micro_batch_size=8"]


def _missing(package: str) -> str:
    return (f"needs the {package} package, which is not installed: pip install 'llmtrain[{package}]' "
            f"(in a checkout: pip install -e '.[{package}]')")


def _offline_env(tmp_path: Path, **extra: str) -> dict:
    """W&B offline, with its own folders in tmp_path, and no git probing: nothing leaves this machine."""
    home = tmp_path / "wandb-home"
    return {"WANDB_MODE": "offline", "WANDB_DISABLE_GIT": "true", "WANDB_CONFIG_DIR": str(home / "config"),
            "WANDB_CACHE_DIR": str(home / "cache"), "WANDB_DATA_DIR": str(home / "data"), **extra}


def _launch(run_dir: Path, *overrides: str, env: dict, ok: bool = True):
    result = run_cli(["launch", f"run.dir={run_dir}", *ONE, *overrides], cwd=run_dir.parent, env=env)
    if ok:
        assert result.returncode == 0, f"launch failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


def _losses(run_dir: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_rows(run_dir) if "loss" in r}


# ---------------------------------------------------------------------------------------------- reading W&B files

def _wandb_records(path: Path):
    """The records of a .wandb file (LevelDB's log format: 32 KiB blocks of chunks, each with a 7-byte header of
    CRC, length and type), as wandb's protobuf Records."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B data file"
    pos, record = 7, b""  # after the file header: ":W&B", magic, version
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # a block's tail too short for a header is padding
            pos += 32768 - pos % 32768
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind == 0:
            continue
        record = chunk if kind in (1, 2) else record + chunk  # 1 full, 2 first, 3 middle, 4 last
        if kind in (1, 4):
            parsed = wandb_internal_pb2.Record()
            parsed.ParseFromString(record)
            yield parsed


def _wandb_run(folder: Path) -> dict:
    """What one offline W&B run folder holds: its run record, config, history rows by step and exit code."""
    (path,) = folder.glob("run-*.wandb")
    run, config, history, exit_code = None, {}, {}, None
    for record in _wandb_records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run = record.run
            config.update({i.key: json.loads(i.value_json) for i in record.run.config.update})
        elif kind == "config":
            config.update({i.key: json.loads(i.value_json) for i in record.config.update})
        elif kind == "history":
            row = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
            history[row["_step"]] = row
        elif kind == "exit":
            exit_code = record.exit.exit_code
    config.pop("_wandb", None)
    return {"id": run.run_id, "name": run.display_name, "group": run.run_group, "project": run.project,
            "tags": list(run.tags), "config": config, "history": history, "exit_code": exit_code}


def _wandb_runs(run_dir: Path) -> list[dict]:
    return [_wandb_run(f) for f in sorted((run_dir / "wandb").glob("offline-run-*"))]


def _mlflow(run_dir: Path):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{run_dir / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("llmtrain")
    return client, client.search_runs([experiment.experiment_id])


# ------------------------------------------------------------------------------------------ end to end, both runs

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

    from llmtrain.config import extras

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
