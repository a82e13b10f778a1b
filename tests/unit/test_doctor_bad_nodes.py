"""`llmtrain doctor` names the hosts the configured run.dir's nodes.json holds bad (llmtrain/doctor/ledger_marks.py)."""

from __future__ import annotations

from omegaconf import OmegaConf

from llmtrain.doctor.ledger_marks import ledger_lines
from llmtrain.rundir.node_ledger import record_node_event


def test_doctor_marks_the_run_dirs_bad_hosts(tmp_path):
    cfg = OmegaConf.create({"run": {"dir": str(tmp_path)}, "cluster": {"bad_node_failures": 2}})
    assert ledger_lines(cfg) == []  # no nodes.json: nothing said
    record_node_event(str(tmp_path), "node1", "failure", "rank 0 on node1 exited 1")
    assert ledger_lines(cfg) == []  # one failure of two
    record_node_event(str(tmp_path), "node1", "hang", "rank 0 on node1 stopped responding")
    record_node_event(str(tmp_path), "node2", "startup", "cluster.setup line 1 (false) exited with status 1")
    assert ledger_lines(cfg) == [
        f"llmtrain doctor: node1 is marked bad in {tmp_path}/nodes.json (2 failures: rank 0 on node1 stopped "
        "responding); the run's Slurm requeue leaves it out (cluster.exclude_bad_nodes)",
        f"llmtrain doctor: node2 is marked bad in {tmp_path}/nodes.json (1 start-up failure: cluster.setup line 1 "
        "(false) exited with status 1); the run's Slurm requeue leaves it out (cluster.exclude_bad_nodes)"]
