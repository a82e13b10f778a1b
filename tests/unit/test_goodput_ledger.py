"""The goodput ledger's arithmetic over hand-made timelines (llmtrain.rundir.goodput)."""

from __future__ import annotations

import pytest

from llmtrain.rundir.goodput import append_entry, ledger_entry, read_ledger, summary_lines, totals

PARTS = ("productive_s", "queue_s", "startup_s", "checkpoint_s", "lost_s", "restart_s", "shutdown_s")


def ev(event, t, step, attempt=0, **extra):
    return {"event": event, "t": t, "step": step, "attempt": attempt, "requeue": 0, **extra}


def test_clean_start_splits_into_startup_training_saves_and_shutdown():
    events = [ev("train", 110, 0), ev("step", 120, 4), ev("save", 122, 4, blocked_s=2.0), ev("step", 140, 8),
              ev("save", 143, 8, blocked_s=3.0), ev("end", 143, 8)]
    entry = ledger_entry(events, started=100, ended=150)
    assert entry == {"productive_s": 28.0, "queue_s": 0.0, "startup_s": 10.0, "checkpoint_s": 5.0, "lost_s": 0.0,
                     "restart_s": 0.0, "shutdown_s": 7.0, "allocated_s": 50.0, "goodput": 0.56, "restarts": 0,
                     "requeues": 0}


def test_failure_loses_the_work_after_the_checkpoint_resumed_from():
    events = [ev("train", 110, 0), ev("save", 122, 4, blocked_s=2.0), ev("step", 130, 6),
              ev("save", 133, 6, blocked_s=1.0), ev("step", 141, 9),
              # attempt 1 starts at 150 from the checkpoint of step 6: 141 - 133 = 8 s lost
              ev("train", 150, 6, attempt=1), ev("step", 160, 10, attempt=1), ev("end", 160, 10, attempt=1)]
    entry = ledger_entry(events, started=100, ended=165, queue_s=5.0)
    assert entry["lost_s"] == 8.0
    assert entry["restart_s"] == 9.0  # 141 -> 150
    assert entry["checkpoint_s"] == 3.0
    assert entry["productive_s"] == (133 - 110 - 3.0) + (160 - 150)
    assert entry["restarts"] == 1 and entry["allocated_s"] == 70.0
    assert sum(entry[k] for k in PARTS) == pytest.approx(entry["allocated_s"])


def test_failure_before_any_save_loses_the_whole_attempt():
    events = [ev("train", 10, 0), ev("step", 20, 3), ev("train", 25, 0, attempt=1), ev("end", 30, 2, attempt=1)]
    entry = ledger_entry(events, started=0, ended=31)
    assert entry["lost_s"] == 10.0 and entry["productive_s"] == 5.0 and entry["restart_s"] == 5.0


def test_last_attempt_that_died_counts_from_the_newest_complete_checkpoint():
    events = [ev("train", 10, 0), ev("save", 20, 5, blocked_s=1.0), ev("step", 26, 8)]
    entry = ledger_entry(events, started=0, ended=30, kept_step=5)
    assert entry["lost_s"] == 6.0 and entry["productive_s"] == 9.0 and entry["shutdown_s"] == 4.0
    # A preempted attempt's last event is its save: nothing lost.
    preempted = [ev("train", 10, 0), ev("step", 19, 8), ev("save", 20, 8, blocked_s=1.0)]
    assert ledger_entry(preempted, started=0, ended=21, kept_step=8)["lost_s"] == 0.0


def test_no_first_step_is_all_startup_and_requeues_are_counted():
    assert ledger_entry([], started=0, ended=12)["startup_s"] == 12.0
    assert ledger_entry([], started=0, ended=12)["goodput"] == 0.0
    requeued = [dict(ev("train", 1, 0), requeue=2), dict(ev("end", 3, 4), requeue=2)]
    assert ledger_entry(requeued, started=0, ended=4)["requeues"] == 2


def test_ledger_file_and_summary(tmp_path):
    assert read_ledger(str(tmp_path)) == [] and summary_lines([]) == []
    first = ledger_entry([ev("train", 2, 0), ev("end", 8, 4)], started=0, ended=10)
    second = ledger_entry([ev("train", 1, 4), ev("end", 9, 8)], started=0, ended=10)
    append_entry(str(tmp_path), first)
    append_entry(str(tmp_path), second)
    starts = read_ledger(str(tmp_path))
    assert starts == [first, second]
    assert totals(starts)["productive_s"] == 14.0 and totals(starts)["allocated_s"] == 20.0
    # A Slurm job's starts carry its running requeue count (0, 1, 2): two of the three starts were requeues.
    assert totals([{"requeues": 0}, {"requeues": 1}, {"requeues": 2}])["requeues"] == 2
    lines = summary_lines(starts)
    assert lines[0] == ("goodput", "70.0% = productive 14.0 s / allocated 20.0 s (2 start(s))")
    assert [label for label, _ in lines[1:]] == ["queue", "start-up", "checkpoint saves", "lost work", "restarts"]
    assert lines[2] == ("start-up", "3.0 s (15.0%); shutdown 3.0 s (15.0%)")
