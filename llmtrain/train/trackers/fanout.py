"""The enabled trackers of a launch behind one log/finish pair. A tracker that fails (a network that is down, a
server that refuses, a full disk) or does not start in time costs one warning line and is off for the rest of the
launch; training goes on."""

from __future__ import annotations

import threading

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
    _off(tracker, f"failed to {doing} ({reason})")


def _off(tracker: Tracker, what: str) -> None:
    print(f"llmtrain: warning: {tracker.title} {what}; {tracker.title} logging is off for the rest of this launch",
          flush=True)


def start_timeout_s(cfg: DictConfig) -> float:
    """logging.tracker_start_timeout_s, and at most half of launch.pg_timeout_s: the other ranks wait for rank 0's
    trackers in a collective, which fails the job after pg_timeout_s."""
    return min(cfg.logging.tracker_start_timeout_s, cfg.launch.pg_timeout_s / 2)


def _start_within(tracker: Tracker, timeout_s: float, config: dict, run_dir: str, resume_id: str | None
                  ) -> str | None:
    """The tracker's run id, or None (said in one warning line) when its start fails or takes longer than
    timeout_s: rank 0 waits for it while every other rank waits for rank 0 in a collective. A start that is
    given up on goes on in a daemon thread; whatever it does later is not used."""
    result: dict = {}

    def start() -> None:
        try:
            result["id"] = tracker.start(config, run_dir, resume_id)
        except Exception as e:  # noqa: BLE001 - said by the caller, in its thread
            result["error"] = e

    thread = threading.Thread(target=start, name=f"start {tracker.title}", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        _off(tracker, f"did not start its run within {timeout_s:g} s (logging.tracker_start_timeout_s, at most "
                      "half of launch.pg_timeout_s)")
        return None
    if "id" not in result:
        _warn(tracker, "start its run", result.get("error") or RuntimeError("its start ended without a run id"))
        return None
    return result["id"]


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
        run_id = _start_within(tracker, start_timeout_s(cfg), config, run_dir, ids.get(tracker.name))
        if run_id is not None:
            ids[tracker.name] = run_id
            started.append(tracker)
    write_run_ids(run_dir, ids)
    return Trackers(started)
