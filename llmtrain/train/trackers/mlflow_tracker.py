"""MLflow: one MLflow run per llmtrain run, the config as params, the metrics by step. Without a tracking URI the
store is local to the run: RUN_DIR/mlflow.db (MLflow's file store is deprecated; SQLite is its local database)."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

from llmtrain.config.compose import flat_keys
from llmtrain.train.trackers.base import SWEEP_NAME_ENV, Tracker, scalars
from llmtrain.rundir.paths import RunPaths

LOCAL_ARTIFACTS = "mlartifacts"
RUN_STATUS = {"finished": "FINISHED", "failed": "FAILED", "preempted": "KILLED"}
SWEEP_TAG = "llmtrain.sweep"


def local_store_uri(run_dir: str) -> str:
    return "sqlite:///" + RunPaths(os.path.abspath(run_dir)).mlflow_db


def flatten(config: dict) -> dict[str, str]:
    """Dotted keys and text values (lists as JSON), as MLflow params are."""
    return {key: json.dumps(value) if isinstance(value, (dict, list)) else str(value)
            for key, value in flat_keys(config).items()}


def params(config: dict) -> dict[str, str]:
    """The config as MLflow params within its limits: key characters, key and value lengths."""
    from mlflow.utils.validation import MAX_ENTITY_KEY_LENGTH, MAX_PARAM_VAL_LENGTH

    out = {}
    for key, value in flatten(config).items():
        key = re.sub(r"[^\w./\- ]", "_", key)[:MAX_ENTITY_KEY_LENGTH]
        out[key] = value if len(value) <= MAX_PARAM_VAL_LENGTH else value[:MAX_PARAM_VAL_LENGTH - 3] + "..."
    return out


class MlflowTracker(Tracker):
    name = "mlflow"
    key = "logging.mlflow"
    title = "MLflow"

    def __init__(self, logging_cfg):
        self.tracking_uri = logging_cfg.mlflow_tracking_uri
        self.experiment = logging_cfg.mlflow_experiment
        self.client = None
        self.run_id = None

    def start(self, config: dict, run_dir: str, resume_id: str | None) -> str:
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=self.tracking_uri or local_store_uri(run_dir))
        self.run_id = resume_id if resume_id and self._exists(resume_id) else None
        if self.run_id is not None:
            self.client.update_run(self.run_id, status="RUNNING")
        else:
            sweep = os.environ.get(SWEEP_NAME_ENV)
            run = self.client.create_run(self._experiment_id(run_dir), run_name=config["run"]["name"],
                                         tags={SWEEP_TAG: sweep} if sweep else None)
            self.run_id = run.info.run_id
        self._log_params(params(config))
        return self.run_id

    def _exists(self, run_id: str) -> bool:
        from mlflow.exceptions import MlflowException

        try:
            self.client.get_run(run_id)
        except MlflowException:
            print(f"llmtrain: MLflow run {run_id} of this run directory is not in {self.client.tracking_uri}; "
                  "starting a new MLflow run", flush=True)
            return False
        return True

    def _experiment_id(self, run_dir: str) -> str:
        from mlflow.exceptions import MlflowException

        found = self.client.get_experiment_by_name(self.experiment)
        if found is not None:
            return found.experiment_id
        # The local store keeps artifacts next to it; a tracking server decides for itself.
        where = None if self.tracking_uri else Path(run_dir, LOCAL_ARTIFACTS).resolve().as_uri()
        try:
            return self.client.create_experiment(self.experiment, artifact_location=where)
        except MlflowException:  # created meanwhile by another run of a sweep
            return self.client.get_experiment_by_name(self.experiment).experiment_id

    def _log_params(self, wanted: dict[str, str]) -> None:
        """Params a resumed run does not have yet; MLflow keeps a param's first value (it refuses a change)."""
        from mlflow.entities import Param
        from mlflow.utils.validation import MAX_PARAMS_TAGS_PER_BATCH

        have = self.client.get_run(self.run_id).data.params
        new = [Param(k, v) for k, v in wanted.items() if k not in have]
        for i in range(0, len(new), MAX_PARAMS_TAGS_PER_BATCH):
            self.client.log_batch(self.run_id, params=new[i:i + MAX_PARAMS_TAGS_PER_BATCH])

    def log(self, row: dict) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(k, float(v), now, row["step"]) for k, v in scalars(row).items()]
        if metrics:
            self.client.log_batch(self.run_id, metrics=metrics)

    def finish(self, status: str) -> None:
        self.client.set_terminated(self.run_id, RUN_STATUS[status])
