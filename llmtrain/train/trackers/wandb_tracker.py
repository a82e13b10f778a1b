"""Weights & Biases: one W&B run per llmtrain run, its files under RUN_DIR/wandb (also with WANDB_MODE=offline)."""

from __future__ import annotations

import errno
import os
import shutil

from llmtrain.train.trackers.base import SWEEP_NAME_ENV, Tracker, scalars
from llmtrain.rundir.paths import RunPaths

# wandb.finish's exit code per status: non-zero is a failed run, or with mark_preempting() a preempted one.
EXIT_CODES = {"finished": 0, "failed": 1, "preempted": 143}
# W&B writes its history from a service process and says nothing when the disk is full (the rows are lost): a
# folder with less free space than this counts as full.
FULL_BELOW_BYTES = 1 << 20


class WandbTracker(Tracker):
    name = "wandb"
    key = "logging.wandb"
    title = "W&B"

    def __init__(self, logging_cfg):
        self.project = logging_cfg.wandb_project
        self.entity = logging_cfg.wandb_entity
        self.tags = [str(t) for t in logging_cfg.wandb_tags]
        self.run = None
        self.first_step = 0
        self.folder = ""

    def start(self, config: dict, run_dir: str, resume_id: str | None) -> str:
        import wandb

        resume = {"id": resume_id, "resume": "allow", "allow_val_change": True} if resume_id else {}
        self.run = wandb.init(project=self.project, entity=self.entity, name=config["run"]["name"],
                              group=os.environ.get(SWEEP_NAME_ENV) or None, tags=self.tags, config=config,
                              dir=run_dir, **resume)
        self.folder = RunPaths(run_dir).wandb
        # A resumed W&B run already holds the steps up to here (online; offline it says 0): W&B refuses, with a
        # warning each, steps below it, such as those a resume from an earlier checkpoint runs again.
        self.first_step = self.run.starting_step
        return self.run.id

    def log(self, row: dict) -> None:
        free = shutil.disk_usage(self.folder).free
        if free < FULL_BELOW_BYTES:
            raise OSError(errno.ENOSPC, f"No space left on device: {free} bytes free in {self.folder}, where W&B "
                                        "writes its history")
        if row["step"] >= self.first_step:
            self.run.log(scalars(row), step=row["step"])

    def finish(self, status: str) -> None:
        if status == "preempted":
            self.run.mark_preempting()
        self.run.finish(exit_code=EXIT_CODES[status])
