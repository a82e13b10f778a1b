"""RUN_DIR/nodes.json (llmtrain/rundir/node_ledger.py): counts per host and kind, the last few events, atomic
writes that several processes can make at once."""

from __future__ import annotations

import json
import multiprocessing
import os

import pytest

from llmtrain.rundir.node_ledger import EVENTS_KEPT, read_ledger, record_node_event


def test_events_are_counted_per_host_and_kind_with_the_last_few_kept(tmp_path):
    run_dir = str(tmp_path)
    for i in range(EVENTS_KEPT + 2):
        record_node_event(run_dir, "node2", "failure", f"rank 1 on node2 exited {i}", job="7")
    record_node_event(run_dir, "node2", "hang", "rank 1 stopped responding")
    record_node_event(run_dir, "node1", "straggler", "step time 2.1x the median")
    ledger = json.loads((tmp_path / "nodes.json").read_text())
    node2 = ledger["hosts"]["node2"]
    assert {k: node2[k] for k in ("failure", "startup", "hang", "straggler")} == \
        {"failure": EVENTS_KEPT + 2, "startup": 0, "hang": 1, "straggler": 0}
    assert [e["detail"] for e in node2["last"]] == \
        [f"rank 1 on node2 exited {i}" for i in range(3, EVENTS_KEPT + 2)] + ["rank 1 stopped responding"]
    assert node2["last"][0]["job"] == "7" and node2["last"][0]["kind"] == "failure"
    assert ledger["hosts"]["node1"]["straggler"] == 1
    assert sorted(os.listdir(tmp_path)) == ["nodes.json", "nodes.json.lock"]  # no temporary file left


def test_an_unknown_kind_is_refused_and_nothing_is_written(tmp_path):
    with pytest.raises(ValueError, match="unknown node event kind 'slow'"):
        record_node_event(str(tmp_path), "node1", "slow", "x")
    assert read_ledger(str(tmp_path))["hosts"] == {}


def test_an_unreadable_ledger_reads_as_empty(tmp_path):
    (tmp_path / "nodes.json").write_text("{not json")
    assert read_ledger(str(tmp_path)) == {"hosts": {}, "starts": {}, "excluded": {}, "stopped": None}
    record_node_event(str(tmp_path), "node1", "startup", "cluster.setup line 1 (false) exited with status 1")
    assert read_ledger(str(tmp_path))["hosts"]["node1"]["startup"] == 1


def _writer(run_dir: str, host: str, n: int) -> None:
    for i in range(n):
        record_node_event(run_dir, host, "failure", f"event {i}")


def test_several_writers_at_once_lose_no_event(tmp_path):
    procs = [multiprocessing.get_context("fork").Process(target=_writer, args=(str(tmp_path), f"node{i % 2}", 25))
             for i in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    hosts = read_ledger(str(tmp_path))["hosts"]
    assert hosts["node0"]["failure"] == 50 and hosts["node1"]["failure"] == 50
