"""The Slurm job's requeue rules (llmtrain/launch/node/requeue_policy.py): which hosts are bad, the ExcNodeList
they make, and the crash-loop breaker's count of starts without a new checkpoint."""

from __future__ import annotations

from llmtrain.launch.node.requeue_policy import (bad_hosts, breaker_reason, exclusion, note_end, note_start,
                                                 too_few_left)
from llmtrain.rundir.node_ledger import add_event, empty_ledger
from llmtrain.slurm.node_states import split_hosts


def _ledger(*events: tuple[str, str, str]) -> dict:
    ledger = empty_ledger()
    for host, kind, detail in events:
        add_event(ledger, host, kind, detail)
    return ledger


def test_one_start_up_failure_or_the_threshold_of_failures_and_hangs_makes_a_host_bad():
    ledger = _ledger(("node1", "startup", "cluster.setup line 1 (false) exited with status 1"),
                     ("node2", "failure", "rank 1 on node2 exited 1"),
                     ("node3", "failure", "rank 2 on node3 exited 1"), ("node3", "hang", "rank 2 hung"),
                     *[("node4", "straggler", "slow")] * 5)
    assert bad_hosts(ledger, 2) == {
        "node1": "1 start-up failure: cluster.setup line 1 (false) exited with status 1",
        "node3": "2 failures: rank 2 hung"}
    assert sorted(bad_hosts(ledger, 1)) == ["node1", "node2", "node3"]  # stragglers never


def test_the_exclusion_keeps_what_the_job_excludes_and_adds_only_new_bad_hosts():
    ledger = _ledger(("node2", "startup", "x"), ("node5", "startup", "y"))
    hosts, added = exclusion(ledger, ["node9", "node5"], 2)
    assert hosts == ["node9", "node5", "node2"] and added == {"node2": "1 start-up failure: x"}
    assert exclusion(ledger, ["node2", "node5"], 2) == (["node2", "node5"], {})
    assert split_hosts("(null)") == [] and split_hosts("node1,node[3-4]") == ["node1", "node[3-4]"]


def test_excluding_too_many_nodes_is_a_reason_to_stop():
    assert too_few_left(["node1", "node2"], ["node1"], 1) is None
    assert too_few_left(["node1", "node2"], ["node1", "node2"], 1) == \
        "excluding node1,node2 would leave 0 of the partition's 2 node(s) for cluster.nnodes=1"
    assert too_few_left(None, ["node1"], 4) is None  # sinfo could not tell: requeue and let Slurm decide


def test_the_breaker_counts_starts_in_a_row_that_saved_no_new_checkpoint():
    ledger = empty_ledger()
    note_start(ledger, "12", 0, None)
    assert note_end(ledger, None, "rank 1 on node2 exited 1") == 1
    note_start(ledger, "12", 1, None)
    assert note_end(ledger, 40, None) == 0  # saved step 40: progress
    counts = []
    for restart in (2, 3, 4):
        note_start(ledger, "12", restart, 40)
        counts.append(note_end(ledger, 40, "rank 1 on node2 exited 1"))
    assert counts == [1, 2, 3]
    assert breaker_reason(2, 3, "rank 1 on node2 exited 1") is None
    assert breaker_reason(3, 3, "rank 1 on node2 exited 1") == \
        "3 starts in a row saved no checkpoint (last: rank 1 on node2 exited 1)"
    assert breaker_reason(99, 0, None) is None  # 0: the breaker is off
    ledger["stopped"] = {"reason": "..."}
    note_start(ledger, "13", 0, 40)  # a new job (a new launch) counts afresh
    assert ledger["starts"]["without_progress"] == 0 and ledger["stopped"] is None
