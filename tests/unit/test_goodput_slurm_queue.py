"""A Slurm start's queue wait for the goodput ledger, from scontrol's fields and the ledger's previous start."""

from __future__ import annotations

import time

from llmtrain.launch.goodput_entry import slurm_queue_s
from llmtrain.rundir.goodput import append_entry


def stamp(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(seconds))


def test_first_start_waits_from_submission(tmp_path):
    fields = {"SubmitTime": stamp(1_800_000_000), "StartTime": stamp(1_800_000_042)}
    assert slurm_queue_s(str(tmp_path), fields, requeued=False) == 42.0
    assert slurm_queue_s(str(tmp_path), {"SubmitTime": "Unknown", "StartTime": "Unknown"}, requeued=False) == 0.0


def test_requeued_start_waits_from_the_previous_start_end(tmp_path):
    append_entry(str(tmp_path), {"job_id": "7", "ended_at": 1_800_000_100.0})
    fields = {"SubmitTime": stamp(1_800_000_000), "StartTime": stamp(1_800_000_130)}
    assert slurm_queue_s(str(tmp_path), fields, requeued=True) == 30.0
