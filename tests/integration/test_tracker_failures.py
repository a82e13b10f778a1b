"""A tracker never stalls or silently fails a run: a store that cannot take the run is refused before launch, a
start that takes too long is given up, and a tracker that stops recording (a full W&B folder) is said once."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from llmtrain.cli import main
from llmtrain.config import compose_config
from llmtrain.train.trackers.base import Tracker
from llmtrain.train.trackers.fanout import Trackers, open_trackers
from llmtrain.train.trackers.run_ids import read_run_ids

OFF = "or set logging.mlflow=false to train without it"


def _refused(capsys, tmp_path, *overrides: str) -> str:
    run_dir = tmp_path / "run"
    assert main(["launch", f"run.dir={run_dir}", "logging.mlflow=true", *overrides]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1, captured
    assert not run_dir.exists()
    return captured.err


def test_an_mlflow_store_that_cannot_take_the_run_is_refused_before_launch(tmp_path, capsys):
    pytest.importorskip("mlflow", reason="the mlflow extra is not installed")
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    # Permission bits do not stop root: a file where the store's folder should be does.
    err = _refused(capsys, tmp_path, f"logging.mlflow_tracking_uri=sqlite:///{blocker}/mlflow.db")
    assert err == (f"llmtrain: error: logging.mlflow_tracking_uri: MLflow's store cannot be written: {blocker} is "
                   f"not a folder; pick a writable place (logging.mlflow_tracking_uri) {OFF}\n")
    err = _refused(capsys, tmp_path, f"logging.mlflow_tracking_uri=file://{blocker}/mlruns")
    assert err.startswith(f"llmtrain: error: logging.mlflow_tracking_uri: MLflow's store cannot be written: {blocker} "
                          f"is not a folder (in the path {blocker}/mlruns); ")
    started = time.monotonic()
    err = _refused(capsys, tmp_path, "logging.mlflow_tracking_uri=http://127.0.0.1:1")
    assert err == ("llmtrain: error: logging.mlflow_tracking_uri: the MLflow tracking server http://127.0.0.1:1 does "
                   f"not answer from here within 5 s (Connection refused); start it, fix the URI, {OFF}\n")
    assert time.monotonic() - started < 5
    # The local store, RUN_DIR/mlflow.db, is checked too: here a folder took its name. --dry-run refuses alike.
    (tmp_path / "kept" / "mlflow.db").mkdir(parents=True)
    assert main(["launch", "--dry-run", f"run.dir={tmp_path / 'kept'}", "logging.mlflow=true"]) == 2
    assert capsys.readouterr().err == (f"llmtrain: error: logging.mlflow: MLflow's store cannot be written: "
                                       f"{tmp_path / 'kept' / 'mlflow.db'} is a folder; pick a writable place "
                                       f"(run.dir) {OFF}\n")
    assert sorted(p.name for p in (tmp_path / "kept").iterdir()) == ["mlflow.db"]
    # A writable store passes (nothing left behind by the check).
    assert main(["launch", "--dry-run", f"run.dir={tmp_path / 'fine'}", "logging.mlflow=true",
                 f"logging.mlflow_tracking_uri=sqlite:///{tmp_path}/mlflow.db"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "kept"]


def test_a_scheme_mlflow_cannot_track_to_is_refused_before_launch(tmp_path, capsys):
    err = _refused(capsys, tmp_path, "logging.mlflow_tracking_uri=ftp://nowhere")
    assert err == ("llmtrain: error: logging.mlflow_tracking_uri: MLflow has no tracking store for the scheme ftp: "
                   "of ftp://nowhere; it tracks to a path or file://, http:// or https://, databricks, or a database "
                   "(sqlite://, postgresql://, mysql://, mssql://, each with an optional +driver); fix the URI "
                   f"{OFF}\n")


def test_the_schemes_checked_are_the_ones_mlflow_tracks_to():
    """untrackable_scheme agrees with MLflow's own registry of tracking stores (its Unity Catalog entries refuse
    to track, with an error of their own)."""
    pytest.importorskip("mlflow", reason="the mlflow extra is not installed")
    from mlflow.exceptions import MlflowException
    from mlflow.tracking._tracking_service.utils import _get_databricks_uc_rest_store, _tracking_store_registry

    from helpers.tracker_stores import MLFLOW_ACCEPTED, MLFLOW_REFUSED

    from llmtrain.train.trackers.stores import untrackable_scheme

    def mlflow_tracks_to(uri: str) -> bool:
        try:
            return _tracking_store_registry.get_store_builder(uri) is not _get_databricks_uc_rest_store
        except MlflowException:
            return False

    for uri in MLFLOW_ACCEPTED + MLFLOW_REFUSED:
        assert (untrackable_scheme(uri) is None) == mlflow_tracks_to(uri), uri


class _Fake(Tracker):
    def __init__(self, name: str, start_s: float = 0.0):
        self.name = self.title = name
        self.start_s, self.rows, self.status = start_s, [], None

    def start(self, config, run_dir, resume_id):
        time.sleep(self.start_s)
        return f"{self.name}-run"

    def log(self, row):
        self.rows.append(row["step"])

    def finish(self, status):
        self.status = status


def test_a_tracker_that_does_not_start_in_time_is_off_and_training_goes_on(tmp_path, capsys):
    cfg = compose_config([f"run.dir={tmp_path}", "logging.tracker_start_timeout_s=0.5"])
    slow, quick = _Fake("Slow", start_s=30), _Fake("Quick")
    started = time.monotonic()
    trackers = open_trackers(cfg, str(tmp_path), resumed=False, trackers=[slow, quick])
    assert time.monotonic() - started < 5
    trackers.log({"step": 1, "loss": 2.0})
    trackers.finish("finished")
    assert capsys.readouterr().out == ("llmtrain: warning: Slow did not start its run within 0.5 s "
                                       "(logging.tracker_start_timeout_s, at most half of launch.pg_timeout_s); Slow "
                                       "logging is off for the rest of this launch\n")
    assert (slow.rows, slow.status) == ([], None) and (quick.rows, quick.status) == ([1], "finished")
    assert read_run_ids(str(tmp_path)) == {"Quick": "Quick-run"}
    # Never longer than half the collective timeout the other ranks wait under.
    cfg = compose_config([f"run.dir={tmp_path}", "launch.pg_timeout_s=1"])
    open_trackers(cfg, str(tmp_path), resumed=False, trackers=[_Fake("Slow", start_s=30)])
    assert "did not start its run within 0.5 s" in capsys.readouterr().out


def test_a_full_wandb_folder_stops_wandb_with_one_warning(tmp_path, capsys, monkeypatch):
    from llmtrain.train.trackers import wandb_tracker

    cfg = compose_config([f"run.dir={tmp_path}"])
    wandb = wandb_tracker.WandbTracker(cfg.logging)
    logged = []
    wandb.run, wandb.folder = SimpleNamespace(log=lambda values, step: logged.append(step)), str(tmp_path)
    other = _Fake("Other")
    trackers = Trackers([wandb, other])
    trackers.log({"step": 1, "loss": 2.0})
    # W&B's service loses the rows of a full disk without a word: the folder's free space tells.
    monkeypatch.setattr(wandb_tracker.shutil, "disk_usage", lambda path: SimpleNamespace(free=4096))
    for step in (2, 3):
        trackers.log({"step": step, "loss": 2.0})
    assert logged == [1] and other.rows == [1, 2, 3]
    assert capsys.readouterr().out == (
        "llmtrain: warning: W&B failed to log step 2 (OSError: [Errno 28] No space left on device: 4096 bytes free "
        f"in {tmp_path}, where W&B writes its history); W&B logging is off for the rest of this launch\n")
