"""logging.mlflow_tracking_uri's scheme is checked before launch: one MLflow cannot track to is refused in one line
naming the key and the schemes it takes, instead of MLflow being switched off once the run has started."""

from __future__ import annotations

import pytest
from helpers.tracker_stores import MLFLOW_ACCEPTED, MLFLOW_REFUSED

from llmtrain.config import compose_config
from llmtrain.config.errors import ConfigError
from llmtrain.train.trackers.stores import check_tracker_stores, untrackable_scheme


@pytest.mark.parametrize("uri", MLFLOW_ACCEPTED)
def test_schemes_mlflow_tracks_to_pass(uri):
    assert untrackable_scheme(uri) is None


@pytest.mark.parametrize("uri", MLFLOW_REFUSED)
def test_other_schemes_are_named(uri):
    why = untrackable_scheme(uri)
    assert why is not None and f" of {uri}; it tracks to a path or file://, http:// or https://, databricks, " in why


def test_an_untrackable_uri_is_refused_before_launch(tmp_path):
    cfg = compose_config([f"run.dir={tmp_path / 'run'}", "logging.mlflow=true",
                          "logging.mlflow_tracking_uri=ftp://nowhere"])
    with pytest.raises(ConfigError) as info:
        check_tracker_stores(cfg)
    assert info.value.key == "logging.mlflow_tracking_uri"
    assert info.value.message.startswith(
        "MLflow has no tracking store for the scheme ftp: of ftp://nowhere; it tracks to a path or file://, "
        "http:// or https://, databricks, or a database (sqlite://, postgresql://, mysql://, mssql://, each with an "
        "optional +driver)")
    assert info.value.message.endswith("; fix the URI or set logging.mlflow=false to train without it")
    cfg.logging.mlflow = False  # not asked for: nothing checked
    check_tracker_stores(cfg)
    assert not (tmp_path / "run").exists()
