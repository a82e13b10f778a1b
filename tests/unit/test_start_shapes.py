"""Each start's node count and layout where a user reads them: `llmtrain status` (job.json's starts), `llmtrain
report` (goodput.json's nodes/layout, written at each start's end), and the goodput ledger's account of the time
between a lost node and the next start's first step."""

from __future__ import annotations

import json
import time

from helpers.fake_run import make_run
from helpers.job_records import launch_entry

from llmtrain.config import load_run_config
from llmtrain.jobs.status import facts, lines, starts_line
from llmtrain.launch.goodput_entry import record_start
from llmtrain.report.run_report import summarize
from llmtrain.report.start_shapes import summary_rows
from llmtrain.rundir.goodput import append_entry, ledger_entry, read_ledger, summary_lines, totals
from llmtrain.rundir.metrics_file import read_metrics


def at(hour: int, minute: int) -> float:
    """2026-12-05 HH:MM on this machine's clock, as job.json's times and the report's are written."""
    return time.mktime((2026, 12, 5, hour, minute, 0, 0, 0, -1))


def start(nnodes: int, layout: str, clock: str, of: int = 2) -> dict:
    """A start as launch/shape/start_record.py writes it into job.json."""
    return {"time": f"2026-12-05 {clock}:12", "nnodes": nnodes, "of": of, "hosts": None, "layout": layout,
            "how": "as configured" if nnodes == of else "same tp x pp"}


SHRUNK = [start(2, "dp=2 tp=1 pp=1", "06:06"), start(1, "dp=1 tp=1 pp=1", "06:08"),
          start(2, "dp=2 tp=1 pp=1", "06:11")]


# ------------------------------------------------------------------------------------------------------- status
def test_starts_line_lists_each_start_when_there_is_more_than_one_or_one_on_fewer_nodes():
    assert starts_line(SHRUNK) == ("2 nodes dp=2 tp=1 pp=1 (06:06), 1 of 2 nodes dp=1 tp=1 pp=1 (06:08), "
                                   "2 nodes dp=2 tp=1 pp=1 (06:11)")
    assert starts_line(SHRUNK[1:2]) == "1 of 2 nodes dp=1 tp=1 pp=1 (06:08)"
    assert starts_line([start(1, "dp=2 tp=1 pp=1", "06:00", of=1)] * 2) == (
        "1 node dp=2 tp=1 pp=1 (06:00), 1 node dp=2 tp=1 pp=1 (06:00)")
    # One start on every node, or none recorded: the nodes line says it all.
    assert starts_line(SHRUNK[:1]) is None and starts_line([]) is None


def test_status_shows_the_launchs_starts_and_json_keeps_them(tmp_path):
    entry = {**launch_entry(backend="ssh"), "starts": SHRUNK}
    run_dir = make_run(tmp_path, "cluster.nnodes=2", launches=[entry])
    f = facts(str(run_dir), load_run_config(str(run_dir / "config.yaml")))
    shown = lines(f)
    assert ("starts      2 nodes dp=2 tp=1 pp=1 (06:06), 1 of 2 nodes dp=1 tp=1 pp=1 (06:08), 2 nodes dp=2 tp=1 pp=1 "
            "(06:11)") in shown, shown
    assert shown.index(next(s for s in shown if s.startswith("starts "))) == \
        shown.index(next(s for s in shown if s.startswith("nodes "))) + 1
    assert json.loads(json.dumps(f))["starts"] == SHRUNK


def test_status_of_a_launch_with_one_full_start_has_no_starts_line(tmp_path):
    entry = {**launch_entry(backend="ssh"), "starts": SHRUNK[:1]}
    run_dir = make_run(tmp_path, "cluster.nnodes=2", launches=[entry])
    f = facts(str(run_dir), load_run_config(str(run_dir / "config.yaml")))
    assert not [s for s in lines(f) if s.startswith("starts")] and f["starts"] == SHRUNK[:1]


# ------------------------------------------------------------------------------------------------------- report
def entry(nodes: int | None, layout: str | None, started: float, productive: float) -> dict:
    """A goodput.json entry of a 100 s start."""
    shape = {} if nodes is None else {"nodes": nodes, "layout": layout}
    return {"launch": 1, "job_id": "7", "started_at": started, "ended_at": started + 100, **shape,
            "productive_s": productive, "allocated_s": 100.0, "goodput": productive / 100}


def test_report_rows_name_each_starts_nodes_layout_and_goodput():
    starts = [entry(2, "dp=2 tp=1 pp=1", at(6, 6), 50.0), entry(1, "dp=1 tp=1 pp=1", at(6, 8), 80.0)]
    assert summary_rows(starts, 2) == [("  starts", "2 nodes dp=2 tp=1 pp=1 (06:06, goodput 50.0%), "
                                                    "1 of 2 nodes dp=1 tp=1 pp=1 (06:08, goodput 80.0%)")]
    assert summary_rows(starts[1:], 2) == [("  starts", "1 of 2 nodes dp=1 tp=1 pp=1 (06:08, goodput 80.0%)")]
    # One start with every node, or a ledger written before starts had a shape: no row.
    assert summary_rows(starts[:1], 2) == []
    assert summary_rows([entry(None, None, at(6, 6), 50.0)] * 2, 2) == []


def test_the_report_summary_has_the_starts_row_under_goodput(tmp_path):
    run_dir = make_run(tmp_path, "cluster.nnodes=2")
    append_entry(str(run_dir), entry(2, "dp=2 tp=1 pp=1", at(6, 6), 50.0))
    append_entry(str(run_dir), entry(1, "dp=1 tp=1 pp=1", at(6, 8), 80.0))
    rows = summarize(str(run_dir), read_metrics(str(run_dir / "metrics.jsonl")),
                     load_run_config(str(run_dir / "config.yaml")))
    labels = [label for label, _ in rows]
    assert labels[labels.index("goodput"):] == ["goodput", "  queue", "  start-up", "  checkpoint saves",
                                                "  lost work", "  restarts", "  starts"]
    assert rows[-1][1] == ("2 nodes dp=2 tp=1 pp=1 (06:06, goodput 50.0%), 1 of 2 nodes dp=1 tp=1 pp=1 (06:08, "
                           "goodput 80.0%)")


def test_a_starts_goodput_entry_carries_its_recorded_nodes_and_layout(tmp_path):
    job = {**launch_entry(backend="slurm", job_id="7"), "starts": SHRUNK[:2]}
    run_dir = make_run(tmp_path, "cluster.nnodes=2", launches=[job])
    recorded = record_start(str(run_dir), time.time() - 5, job_id="7")
    assert (recorded["nodes"], recorded["layout"]) == (1, "dp=1 tp=1 pp=1")
    assert read_ledger(str(run_dir)) == [recorded]


# ------------------------------------------------------------------------------- the time a lost node costs
def test_the_time_from_a_lost_node_to_the_next_first_step_is_counted_not_productive():
    def ev(event, t, step, **extra):
        return {"event": event, "t": t, "step": step, "attempt": 0, "requeue": 0, **extra}

    # Start 1 on 2 nodes: saves step 10 at t=20, trains on, node2 lost after its last event at t=30; Slurm ends
    # the start at t=60. Start 2 on 1 node, requeued: queued 40 s, begins at t=100, first step at t=115.
    first = ledger_entry([ev("train", 10, 0), ev("save", 20, 10, blocked_s=1.0), ev("step", 30, 14)],
                         started=0, ended=60, kept_step=10)
    second = ledger_entry([ev("train", 115, 10), ev("end", 175, 40)], started=100, ended=180, queue_s=40.0)
    assert (first["lost_s"], first["shutdown_s"]) == (10.0, 30.0)  # redone work; the loss until the start ended
    assert (second["queue_s"], second["startup_s"]) == (40.0, 15.0)
    # From the last kept save (t=20) to the next first step (t=115): lost, shutdown, queue and start-up, none of it
    # productive.
    assert first["lost_s"] + first["shutdown_s"] + second["queue_s"] + second["startup_s"] == 115 - 20
    t = totals([first, second])
    assert (t["productive_s"], t["allocated_s"]) == ((20 - 10 - 1.0) + (175 - 115), 60 + 40 + 80)
    said = dict(summary_lines([first, second]))
    assert (said["lost work"], said["queue"], said["start-up"]) == (
        "10.0 s (5.6%)", "40.0 s (22.2%)", "25.0 s (13.9%); shutdown 35.0 s (19.4%)")
