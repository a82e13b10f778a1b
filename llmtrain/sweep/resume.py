"""Which runs of a re-run sweep need no launch: a finished run of the same config is skipped, a run whose job
still runs is left to it; every other run is launched, and checkpoint.resume=auto resumes it in its run dir."""

from __future__ import annotations

import os

from omegaconf import DictConfig

from llmtrain.config.errors import ConfigError
from llmtrain.rundir.paths import RunPaths


def skip_reason(cfg: DictConfig) -> tuple[str, str] | None:
    """("finished" | "running", why) when the run needs no launch, else None."""
    from llmtrain.checkpoint import store
    from llmtrain.checkpoint.diff import config_diff
    from llmtrain.config import load_run_config
    from llmtrain.jobs.job_state import FINISHED, job_state
    from llmtrain.jobs.status import last_train_row

    run_dir = cfg.run.dir
    if not os.path.isfile(RunPaths(run_dir).config):
        return None
    job = job_state(run_dir)
    if job.live:
        return "running", job.reason
    if job.state != FINISHED:
        return None
    try:
        saved = load_run_config(RunPaths(run_dir).config)
    except ConfigError:
        return None  # launching says what is wrong with it
    if config_diff(saved, cfg):
        return None  # another config (a new max_steps, say): the launch resumes or refuses, as a single run does
    latest, _ = store.latest_complete(run_dir)
    step = max(last_train_row(run_dir).get("step", 0), latest.step if latest else 0)
    if step < cfg.train.max_steps:
        return None
    return "finished", f"step {step} of {cfg.train.max_steps}"
