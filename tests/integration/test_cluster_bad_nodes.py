"""Bad nodes and crash loops on the two-node test cluster (scripts/testcluster.sh), two one-node Slurm jobs at once:
- one whose set-up fails on the first node it starts on (and on that node only) requeues itself without that
  node, finishes on the other, and RUN_DIR/nodes.json names the bad node;
- one whose set-up fails on every node stops after cluster.max_starts_without_progress starts, saying why in its
  log and in `llmtrain status`.
Both jobs run side by side, each requeued start waiting out Slurm's hold on requeued jobs."""

from __future__ import annotations

import json
import re
import subprocess
import time

import pytest
from conftest import SMALL, read_rows, run_cli

pytestmark = [pytest.mark.slow, pytest.mark.cluster]
ONE_NODE = [*SMALL, "train.max_steps=4", "train.global_batch_size=4", "train.micro_batch_size=2", "cluster=slurm",
            "cluster.nnodes=1", "cluster.nproc_per_node=1", "cluster.gpus_per_node=0", "cluster.cpus_per_node=1",
            "cluster.time=null"]
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")


def job_state(cluster, job: str) -> str:
    out = subprocess.run(["scontrol", "show", "job", job], env=cluster.environ(), capture_output=True, text=True,
                         timeout=30).stdout
    found = re.search(r"JobState=(\S+)", out)
    return found.group(1) if found else "UNKNOWN"


@pytest.fixture(scope="module")
def jobs(cluster, tmp_path_factory):
    """Submit both jobs, wait for both to end: {name: (run dir, job id, final state, job log)}."""
    tmp = tmp_path_factory.mktemp("bad-nodes")
    # Fails on the node it first ran on, and only there.
    fault = tmp / "fault.sh"
    fault.write_text(f'f={tmp}/bad-node\n[ -e "$f" ] || hostname > "$f"\n[ "$(hostname)" != "$(cat "$f")" ]\n')
    setups = {"exclusion": f"cluster.setup=['sh {fault}']",
              "breaker": "cluster.setup=['false']"}
    extra = {"exclusion": [], "breaker": ["cluster.max_starts_without_progress=2"]}
    submitted = {}
    for name, setup in setups.items():
        run_dir = tmp / name
        result = run_cli(["launch", f"run.dir={run_dir}", *ONE_NODE, setup, *extra[name]], env=cluster.env,
                         timeout=120)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
        submitted[name] = (run_dir, re.search(r"submitted Slurm job (\d+)", result.stdout)[1])
    deadline = time.monotonic() + 480
    states = {}
    try:
        while time.monotonic() < deadline and len(states) < len(submitted):
            for name, (_, job) in submitted.items():
                state = job_state(cluster, job)
                if state in ENDED:
                    states[name] = state
            time.sleep(3)
    finally:
        for _, job in submitted.values():
            subprocess.run(["scancel", job], env=cluster.environ(), capture_output=True, timeout=30)
    out = {}
    for name, (run_dir, job) in submitted.items():
        log = (run_dir / "logs" / f"slurm-{job}.out").read_text()
        out[name] = (run_dir, job, states.get(name, "did not end in 480 s"), log)
    out["bad"] = (tmp / "bad-node").read_text().strip()
    return out


def test_a_node_that_fails_at_start_up_is_left_out_of_the_requeue(jobs):
    run_dir, job, state, log = jobs["exclusion"]
    bad = jobs["bad"]
    good = "node2" if bad == "node1" else "node1"
    assert state == "COMPLETED", log[-3000:]
    line = (f"llmtrain: requeue excludes {bad} (1 start-up failure: cluster.setup line 1 (sh "
            f"{run_dir.parent}/fault.sh) exited with status 1)")
    assert line in log.splitlines(), log[-3000:]
    starts = re.findall(r"^llmtrain: job \d+ on (\S+), rendezvous \S+ \(restart (\d+)\)$", log, re.MULTILINE)
    assert starts == [(good, "1")], log[-3000:]  # the failed start's set-up came before its start line
    ledger = json.loads((run_dir / "nodes.json").read_text())
    assert list(ledger["hosts"]) == [bad]
    assert {k: ledger["hosts"][bad][k] for k in ("failure", "startup", "hang", "straggler")} == \
        {"failure": 0, "startup": 1, "hang": 0, "straggler": 0}
    assert ledger["excluded"]["hosts"] == [bad] and ledger["stopped"] is None
    assert max(r["step"] for r in read_rows(run_dir) if "loss" in r) == 4
    launches = json.loads((run_dir / "job.json").read_text())["launches"]
    assert launches[-1]["excluded_nodes"] == [bad]


def test_a_job_failing_on_every_start_stops_after_the_limit(jobs, cluster):
    run_dir, job, state, log = jobs["breaker"]
    assert state == "FAILED", log[-3000:]
    said = [ln for ln in log.splitlines() if ln.startswith("llmtrain: not requeued: ")]
    last = re.fullmatch(r"llmtrain: not requeued: 2 starts in a row saved no checkpoint \(last: start-up failure "
                        r"on (node[12]): cluster.setup line 1 \(false\) exited with status 1\)", said[-1] if said
                        else "")
    assert len(said) == 1 and last, log[-3000:]
    ledger = json.loads((run_dir / "nodes.json").read_text())
    assert sorted(ledger["hosts"]) == ["node1", "node2"]  # the first failing node was left out of the second start
    assert ledger["starts"]["without_progress"] == 2
    status = run_cli(["status", str(run_dir)], env=cluster.env, timeout=60)
    assert status.returncode == 0, status.stderr
    lines = status.stdout.splitlines()
    assert f"state       failed: {said[-1][len('llmtrain: '):]}" in lines, status.stdout
    assert f"excluded    {last[1]} (bad nodes, RUN_DIR/nodes.json)" not in lines  # the second node: not requeued
    assert re.fullmatch(r"excluded    node[12] \(bad nodes, RUN_DIR/nodes.json\)", lines[-1]), status.stdout
