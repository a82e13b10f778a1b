"""Reading what W&B (offline) and MLflow (local store) recorded, the environment that keeps them local, and
tracking URIs whose schemes MLflow takes or not."""

from __future__ import annotations

import json
import struct
from pathlib import Path

# logging.mlflow_tracking_uri values MLflow's client tracks to, and ones it has no tracking store for.
MLFLOW_ACCEPTED = ("databricks", "databricks://my-profile", "postgresql://u@db:5432/mlflow",
                   "postgresql+psycopg2://u@db/mlflow", "mysql+pymysql://u@db/mlflow", "mssql+pyodbc://u@db/mlflow",
                   "sqlite+pysqlite:///tmp/x.db", "HTTP://tracker:5000", "mlruns", "/tmp/mlruns",
                   "file:///tmp/mlruns")
MLFLOW_REFUSED = ("ftp://nowhere", "s3://bucket/mlruns", "postgres://db/mlflow", "postgresql+a+b://db/mlflow",
                  "databricks-uc", "uc:http://localhost:8080")


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


def _offline_env(tmp_path: Path, **extra: str) -> dict:
    """W&B offline, with its own folders in tmp_path, and no git probing: nothing leaves this machine."""
    home = tmp_path / "wandb-home"
    return {"WANDB_MODE": "offline", "WANDB_DISABLE_GIT": "true", "WANDB_CONFIG_DIR": str(home / "config"),
            "WANDB_CACHE_DIR": str(home / "cache"), "WANDB_DATA_DIR": str(home / "data"), **extra}


def _wandb_runs(run_dir: Path) -> list[dict]:
    return [_wandb_run(f) for f in sorted((run_dir / "wandb").glob("offline-run-*"))]


def _mlflow(run_dir: Path):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{run_dir / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("llmtrain")
    return client, client.search_runs([experiment.experiment_id])
