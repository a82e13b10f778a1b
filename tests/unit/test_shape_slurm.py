"""A Slurm run that accepts fewer nodes (cluster.min_nnodes), its Slurm side with sinfo and scontrol faked on PATH:
the node count each start is pinned to, why the partition's other nodes are not in a start, a start's record and
line in the batch shell, the requeue that grows back, and the requeue policy's fewest nodes."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from helpers.fake_bin import _fake_bin
from helpers.fake_slurm import fake, slurm_cfg  # noqa: F401  (fake: the fixture)
from helpers.job_records import launch_entry

from llmtrain.config import to_yaml
from llmtrain.jobs.status import starts_line
from llmtrain.launch.backends.slurm import SlurmBackend
from llmtrain.launch.launch_record import job_launch
from llmtrain.launch.node.requeue_policy import too_few_left
from llmtrain.launch.node.slurm_requeue import Policy, read_policy, requeue_or_stop
from llmtrain.launch.shape.slurm_node_count import healthy_count, next_count, pin_node_count, release_pinned
from llmtrain.launch.shape.slurm_start import missing_words, record_slurm_start, requeue_to_grow
from llmtrain.rundir.node_ledger import add_event, update_ledger

# sinfo -h -N -o '%N|%T|%P|%E': node2 lost (down, not responding), node3 in another partition.
ONE_DOWN = "node1|allocated|debug*|none\nnode2|down*|debug*|Not responding\nnode3|idle|gpu|none\n"
BOTH_UP = "node1|allocated|debug*|none\nnode2|idle|debug*|none\nnode3|idle|gpu|none\n"


@pytest.fixture
def slurm_bin(tmp_path, monkeypatch):
    """sinfo prints tmp_path/sinfo.txt (its %N-only form: the names); scontrol writes its arguments to
    tmp_path/scontrol.txt, answers `show hostnames` from tmp_path/hostnames.txt and `show job` in text form,
    and exits with tmp_path/scontrol.rc's code (0 without it)."""
    bin_dir = tmp_path / "bin"
    _fake_bin(bin_dir, "sinfo", f'case "$*" in *"%N|"*) cat {tmp_path}/sinfo.txt ;; '
                                f"*) cut -d'|' -f1 {tmp_path}/sinfo.txt ;; esac\n")
    _fake_bin(bin_dir, "scontrol", f'[ "$1" = --json ] && exit 1\necho "$@" >> {tmp_path}/scontrol.txt\n'
                                   f'[ "$2" = hostnames ] && cat {tmp_path}/hostnames.txt\n'
                                   '[ "$2" = job ] && echo "JobId=$3 JobState=RUNNING ExcNodeList=(null)"\n'
                                   f'[ -f {tmp_path}/scontrol.rc ] && echo "scontrol: error: Job is running" >&2 '
                                   f'&& exit "$(cat {tmp_path}/scontrol.rc)"\nexit 0\n')
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.delenv("SLURM_JOB_PARTITION", raising=False)
    (tmp_path / "sinfo.txt").write_text(ONE_DOWN)
    return tmp_path


def scontrol_calls(where: Path) -> list[str]:
    path = where / "scontrol.txt"
    return [c for c in path.read_text().splitlines() if not c.startswith("show ")] if path.exists() else []


def run_dir_with_job(tmp_path: Path, *overrides: str) -> str:
    """A run directory as a Slurm job of 2 nodes (one process each) that accepts 1 finds it: config.yaml, and
    job.json with the launch that submitted job 7."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    cfg = slurm_cfg(f"run.dir={run_dir}", "cluster.min_nnodes=1", "train.global_batch_size=8",
                    "train.micro_batch_size=2", *overrides)
    (run_dir / "config.yaml").write_text(to_yaml(cfg))
    (run_dir / "job.json").write_text(json.dumps({"launches": [launch_entry(backend="slurm", job_id="7")]}))
    return str(run_dir)


# -------------------------------------------------------------------------------------- the node count pinned
@pytest.mark.parametrize("fewest,most,healthy,count", [
    (1, 4, None, 4),  # sinfo cannot say: every node asked for
    (1, 4, 2, 2), (1, 4, 9, 4), (2, 4, 1, 2),  # within [fewest, most]
])
def test_next_count_is_the_healthy_nodes_within_the_range(fewest, most, healthy, count):
    assert next_count(fewest, most, healthy) == count


def test_healthy_nodes_are_the_usable_ones_of_the_partition_less_the_excluded(slurm_bin):
    assert healthy_count(None, []) == 1  # node2 down; node3 is another partition's
    (slurm_bin / "sinfo.txt").write_text(BOTH_UP)
    assert (healthy_count(None, []), healthy_count(None, ["node2"]), healthy_count("gpu", [])) == (2, 1, 1)


def test_pin_sets_node_and_task_count_and_says_a_refusal(slurm_bin):
    assert pin_node_count("7", 1, 2, None, []) is None
    assert scontrol_calls(slurm_bin) == ["update JobId=7 NumNodes=1 NumTasks=1"]
    (slurm_bin / "scontrol.rc").write_text("1")
    assert pin_node_count("7", 1, 2, None, []) == ("could not set job 7's node count to 1: scontrol: error: Job "
                                                   "is running")


def test_a_held_job_is_pinned_leaving_out_its_excluded_nodes_then_released(slurm_bin):
    (slurm_bin / "sinfo.txt").write_text(BOTH_UP)
    release_pinned("7", slurm_cfg("cluster.min_nnodes=1", "cluster.exclude=node2"))
    assert scontrol_calls(slurm_bin) == ["update JobId=7 NumNodes=1 NumTasks=1", "release 7"]


@pytest.mark.parametrize("fewest,held", [(None, False), (1, True)])
def test_only_a_run_that_accepts_fewer_nodes_is_submitted_held_and_pinned(tmp_path, fake, fewest, held):
    f = fake()  # sinfo fails: the count is cluster.nnodes
    backend = SlurmBackend(slurm_cfg(f"cluster.min_nnodes={'null' if fewest is None else fewest}"),
                           str(tmp_path / "run"))
    assert backend.submit() == "123"
    script = str(tmp_path / "run" / "slurm" / "job.sbatch")
    sbatch = ["sbatch", "--parsable", *(["--hold"] if held else []), script]
    pinned = [["scontrol", "update", "JobId=123", "NumNodes=2", "NumTasks=2"], ["scontrol", "release", "123"]]
    assert [c for c in f.calls if c[0] != "sinfo"] == [sbatch, *(pinned if held else [])]


# -------------------------------------------------------------------------------------- a start's nodes and line
def test_missing_words_name_the_nodes_not_in_this_start_and_why(slurm_bin):
    assert missing_words(None, ["node1"], None) == "not in this start: node2: down, not responding (Not responding)"
    (slurm_bin / "sinfo.txt").write_text(BOTH_UP)
    assert missing_words(None, ["node1"], "node2") == "not in this start: node2: idle (excluded)"
    assert missing_words(None, ["node1", "node2"], None) is None
    (slurm_bin / "sinfo.txt").unlink()  # sinfo says nothing: nothing to say
    assert missing_words(None, ["node1"], None) is None


def test_a_start_on_fewer_nodes_is_recorded_and_said_then_the_grown_start(slurm_bin, tmp_path, monkeypatch):
    run_dir = run_dir_with_job(tmp_path)
    (slurm_bin / "hostnames.txt").write_text("node1\n")
    monkeypatch.setenv("SLURM_NNODES", "1")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "node1")
    line, grow = record_slurm_start(run_dir, "7", {"ExcNodeList": "(null)"})
    assert (line, grow) == (
        "llmtrain: this start has 1 of 2 nodes (node1); not in this start: node2: down, not responding (Not "
        "responding): same tp x pp, dp=2 tp=1 pp=1 -> dp=1 tp=1 pp=1, micro-batches per rank 2 -> 4, global batch "
        "8 kept", None)
    entry = job_launch(run_dir, "7")
    assert entry["shape"] == {"nnodes": 1, "overrides": {"cluster.nnodes": 1, "parallel.dp": 1},
                              "how": "same tp x pp"}
    assert [(s["nnodes"], s["of"], s["hosts"], s["layout"]) for s in entry["starts"]] == [
        (1, 2, ["node1"], "dp=1 tp=1 pp=1")]
    # node2 is back: this start requeues itself onto both, recording nothing.
    (slurm_bin / "sinfo.txt").write_text(BOTH_UP)
    assert record_slurm_start(run_dir, "7", {"ExcNodeList": "(null)"}) == (
        "llmtrain: 2 of 2 nodes are healthy now, 1 in this start: requeueing job 7 to start on 2", 2)
    assert len(job_launch(run_dir, "7")["starts"]) == 1
    assert requeue_to_grow("7", 2) is None
    assert scontrol_calls(slurm_bin) == ["requeue 7", "update JobId=7 NumNodes=2 NumTasks=2"]
    # The next start has both: said, from the layout of the start before; then a third start says nothing.
    (slurm_bin / "hostnames.txt").write_text("node1\nnode2\n")
    monkeypatch.setenv("SLURM_NNODES", "2")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "node[1-2]")
    assert record_slurm_start(run_dir, "7", {}) == (
        "llmtrain: this start has all 2 nodes again (node1, node2): dp=1 tp=1 pp=1 -> dp=2 tp=1 pp=1 as configured",
        None)
    assert record_slurm_start(run_dir, "7", {}) == (None, None)
    starts = job_launch(run_dir, "7")["starts"]
    assert [(s["nnodes"], s["layout"]) for s in starts] == [(1, "dp=1 tp=1 pp=1"), (2, "dp=2 tp=1 pp=1"),
                                                           (2, "dp=2 tp=1 pp=1")]
    times = [s["time"][11:16] for s in starts]
    assert starts_line(starts) == (f"1 of 2 nodes dp=1 tp=1 pp=1 ({times[0]}), 2 nodes dp=2 tp=1 pp=1 ({times[1]}), "
                                   f"2 nodes dp=2 tp=1 pp=1 ({times[2]})")


def test_an_excluded_node_that_is_healthy_does_not_make_a_start_grow(slurm_bin, tmp_path, monkeypatch):
    run_dir = run_dir_with_job(tmp_path)
    (slurm_bin / "sinfo.txt").write_text(BOTH_UP)
    (slurm_bin / "hostnames.txt").write_text("node1\n")
    monkeypatch.setenv("SLURM_NNODES", "1")
    line, grow = record_slurm_start(run_dir, "7", {"ExcNodeList": "node2"})
    assert grow is None and line.startswith("llmtrain: this start has 1 of 2 nodes (node1); not in this start: "
                                            "node2: idle (excluded): same tp x pp, ")


def test_a_run_that_accepts_no_fewer_nodes_says_nothing_of_its_start(slurm_bin, tmp_path, monkeypatch):
    run_dir = run_dir_with_job(tmp_path, "cluster.min_nnodes=null")
    (slurm_bin / "hostnames.txt").write_text("node1\nnode2\n")
    monkeypatch.setenv("SLURM_NNODES", "2")
    assert record_slurm_start(run_dir, "7", {}) == (None, None)
    assert job_launch(run_dir, "7")["shape"] == {"nnodes": 2, "overrides": {}, "how": "as configured"}


# ------------------------------------------------------------------------------------------- the requeue policy
def test_the_requeue_policy_reads_the_fewest_nodes_from_min_nnodes(tmp_path):
    assert read_policy(run_dir_with_job(tmp_path)) == Policy(nnodes=1, nodes_key="cluster.min_nnodes", most=2)
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.yaml").write_text(to_yaml(slurm_cfg()))
    assert read_policy(str(other)) == Policy(nnodes=2, nodes_key="cluster.nnodes", most=2)


def test_too_few_left_names_the_key_that_sets_the_fewest_nodes():
    nodes = ["node1", "node2"]
    assert too_few_left(nodes, ["node2"], 1, "cluster.min_nnodes") is None
    assert too_few_left(nodes, ["node1", "node2"], 1, "cluster.min_nnodes") == (
        "excluding node1,node2 would leave 0 of the partition's 2 node(s) for cluster.min_nnodes=1")
    assert too_few_left(nodes, ["node2"], 2) == (
        "excluding node2 would leave 1 of the partition's 2 node(s) for cluster.nnodes=2")


@pytest.mark.parametrize("fewest", [1, None])
def test_a_bad_node_is_left_out_and_the_job_requeued_onto_the_rest_only_when_it_accepts_fewer(
        slurm_bin, tmp_path, fewest):
    run_dir = run_dir_with_job(tmp_path, f"cluster.min_nnodes={'null' if fewest is None else fewest}")
    update_ledger(run_dir, lambda led: add_event(led, "node2", "startup", "srun: error: node2: Communication "
                                                                          "connection failure", "7"))
    # node2 answers, but failed to start the job; the partition has these two nodes.
    (slurm_bin / "sinfo.txt").write_text("node1|allocated|debug*|none\nnode2|idle|debug*|none\n")
    reason = requeue_or_stop(run_dir, "7", "start-up failure on node2")
    if fewest:
        assert reason is None
        assert scontrol_calls(slurm_bin) == ["requeue 7", "update JobId=7 ExcNodeList=node2",
                                             "update JobId=7 NumNodes=1 NumTasks=1"]
    else:
        assert reason == "excluding node2 would leave 1 of the partition's 2 node(s) for cluster.nnodes=2"
        assert scontrol_calls(slurm_bin) == []
