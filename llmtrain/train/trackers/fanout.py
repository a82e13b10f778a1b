"""The enabled trackers of a launch behind one log/finish pair. A tracker that fails (a network that is down, a
server that refuses) costs one warning line and is off for the rest of the launch; training goes on."""

from __future__ import annotations

from omegaconf import DictConfig

from llmtrain.config.compose import to_plain
from llmtrain.train.trackers.base import Tracker
from llmtrain.train.trackers.run_ids import read_run_ids, write_run_ids


def enabled_trackers(cfg: DictConfig) -> list[Tracker]:
    found: list[Tracker] = []
    if cfg.logging.wandb:
        from llmtrain.train.trackers.wandb_tracker import WandbTracker

        found.append(WandbTracker(cfg.logging))
    if cfg.logging.mlflow:
        from llmtrain.train.trackers.mlflow_tracker import MlflowTracker

        found.append(MlflowTracker(cfg.logging))
    return found


def _warn(tracker: Tracker, doing: str, error: BaseException) -> None:
    lines = str(error).strip().splitlines()
    reason = f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__
    print(f"llmtrain: warning: {tracker.title} failed to {doing} ({reason}); {tracker.title} logging is off for "
          "the rest of this launch", flush=True)


class Trackers:
    def __init__(self, trackers: list[Tracker]):
        self.active = list(trackers)

    def log(self, row: dict) -> None:
        for tracker in list(self.active):
            try:
                tracker.log(row)
            except Exception as e:  # noqa: BLE001 - no tracker error may stop training
                self.active.remove(tracker)
                _warn(tracker, f"log step {row.get('step')}", e)

    def finish(self, status: str) -> None:
        for tracker in self.active:
            try:
                tracker.finish(status)
            except Exception as e:  # noqa: BLE001
                _warn(tracker, "finish its run", e)
        self.active = []


def open_trackers(cfg: DictConfig, run_dir: str, resumed: bool, trackers: list[Tracker] | None = None
                  ) -> Trackers | None:
    """Start the enabled trackers (or `trackers`); None when there are none. A resumed run continues the tracker
    runs named in RUN_DIR/trackers.json; a fresh start opens new ones and records their ids there."""
    trackers = enabled_trackers(cfg) if trackers is None else trackers
    if not trackers:
        return None
    config = to_plain(cfg)  # what RUN_DIR/config.yaml holds
    ids = read_run_ids(run_dir) if resumed else {}
    started = []
    for tracker in trackers:
        try:
            ids[tracker.name] = tracker.start(config, run_dir, ids.get(tracker.name))
        except Exception as e:  # noqa: BLE001
            _warn(tracker, "start its run", e)
            continue
        started.append(tracker)
    write_run_ids(run_dir, ids)
    return Trackers(started)
