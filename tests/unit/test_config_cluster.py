"""Multi-node launch without a cluster: the sbatch script and ssh commands rendered from composed configs (ports,
set-up lines, network variables, hostfile slots), and the Slurm follower against a fake scontrol/scancel/sbatch."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest
from conftest import REPO
from helpers.fake_slurm import FakeMonitor, fake, job, partition, slurm_cfg  # noqa: F401  (fake: the fixture)

from llmtrain.cli import main
from llmtrain.config import ConfigError
from llmtrain.launch.backends import slurm, ssh
from llmtrain.launch.config_probes import compose_here, validate_here
from llmtrain.launch.hostfile import cluster_hosts
from llmtrain.launch.backends.slurm import SlurmBackend
from llmtrain.slurm.show_output import parse_text
from llmtrain.launch.backends.ssh import SSHBackend

# ------------------------------------------------------------------------------------------------ Slurm script
def test_slurm_port_is_one_per_job_unless_set():
    assert compose_here(["cluster=slurm"]).cluster.master_port == 0
    script = SlurmBackend(slurm_cfg(), "/tmp/r").script()
    assert "\nport=$((20000 + SLURM_JOB_ID % 20000))\n" in script
    assert '"--rdzv-endpoint=${head}:${port}"' in script
    assert "rendezvous ${head}:${port}" in script  # the job's log names the endpoint when it starts
    assert "\nport=29123\n" in SlurmBackend(slurm_cfg("cluster.master_port=29123"), "/tmp/r").script()


def _fake_bin(tmp_path: Path, name: str, body: str) -> None:
    path = tmp_path / "bin" / name
    path.parent.mkdir(exist_ok=True)
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)


def test_slurm_script_runs_setup_then_exports_then_srun(tmp_path):
    cfg = slurm_cfg("network=ethernet", f"cluster.workdir={tmp_path}")
    cfg.cluster.setup = ['export LLMTRAIN_SETUP_MARK="it\'s $((1 + 1))"  # a comment',
                         'echo "first $NEVER_SET_ANYWHERE" >> order.txt',  # set -u is off for set-up lines
                         "export NCCL_DEBUG=INFO",  # the preset's NCCL_DEBUG=WARN is exported after, and wins
                         "echo second >> order.txt"]
    script = tmp_path / "job.sbatch"
    script.write_text(SlurmBackend(cfg, str(tmp_path / "run")).script())
    _fake_bin(tmp_path, "scontrol", "echo node1\n")
    _fake_bin(tmp_path, "srun", f'printf "%s\\n" "$LLMTRAIN_SETUP_MARK" "$NCCL_DEBUG" "$GLOO_SOCKET_IFNAME" "$@" '
                                f'> {tmp_path}/srun.txt\n')
    env = dict(os.environ, PATH=f"{tmp_path / 'bin'}:{os.environ['PATH']}", SLURM_JOB_ID="123",
               SLURM_JOB_NODELIST="node1")
    result = subprocess.run(["bash", str(script)], cwd="/", env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "order.txt").read_text() == "first \nsecond\n"
    srun = (tmp_path / "srun.txt").read_text().splitlines()
    assert srun[:3] == ["it's 2", "WARN", "^lo,docker"]
    assert "--rdzv-endpoint=node1:20123" in srun and "--rdzv-id=llmtrain-123" in srun
    # Each node turns the preset's ^lo,docker into one of its interface names before the agent starts.
    assert srun[srun.index("-m") + 1] == "llmtrain.launch.node.env"
    assert "llmtrain: job 123 on node1, rendezvous node1:20123" in result.stdout


def test_slurm_script_stops_at_a_failing_setup_line_naming_it(tmp_path):
    cfg = slurm_cfg(f"cluster.workdir={tmp_path}")
    cfg.cluster.setup = ["echo one >> order.txt", "module load no-such-module", "echo three >> order.txt"]
    script = tmp_path / "job.sbatch"
    script.write_text(SlurmBackend(cfg, str(tmp_path / "run")).script())
    _fake_bin(tmp_path, "srun", f"touch {tmp_path}/srun-ran\n")
    env = dict(os.environ, PATH=f"{tmp_path / 'bin'}:{os.environ['PATH']}", SLURM_JOB_ID="7")
    result = subprocess.run(["bash", str(script)], cwd="/", env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert "llmtrain: node set-up failed: cluster.setup line 2 (module load no-such-module) exited with status 127" \
        in result.stderr, result.stderr
    assert (tmp_path / "order.txt").read_text() == "one\n" and not (tmp_path / "srun-ran").exists()


def test_dry_run_shows_setup_lines(capsys):
    setup = "cluster.setup=['module load cuda/12.4','source /shared/venv/bin/activate']"
    assert main(["launch", "--dry-run", "cluster=slurm", "cluster.nnodes=1", setup]) == 0
    out = capsys.readouterr().out
    assert out.index("eval 'module load cuda/12.4'") < out.index("eval 'source /shared/venv/bin/activate'") \
        < out.index("\nsrun ")


@pytest.mark.parametrize("preset", ["ethernet", "infiniband", "roce"])
def test_network_presets_set_gloo_interface_with_nccl(preset):
    env = compose_here([f"network={preset}"]).network.env
    assert env["GLOO_SOCKET_IFNAME"] == env["NCCL_SOCKET_IFNAME"]


@pytest.mark.parametrize("value,interfaces,name", [
    ("^lo,docker", ["lo", "docker0", "eth0", "eth1"], "eth0"),
    ("^lo,docker,eth", ["lo", "eth0", "ib0"], "ib0"),
    ("=ib0", ["eth0", "ib0"], "ib0"),
    ("^lo", ["lo"], None),
])
def test_gloo_interface_resolved_from_nccl_syntax(value, interfaces, name):
    from llmtrain.launch.node import env as node_env

    assert node_env.resolve(value, interfaces) == name


def test_node_env_execs_with_the_resolved_interface(monkeypatch):
    from llmtrain.launch.node import env as node_env

    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "^lo,docker")
    monkeypatch.setattr(node_env, "usable_interfaces", lambda: ["lo", "docker0", "ens5"])
    ran = []
    monkeypatch.setattr(node_env.os, "execvp", lambda file, argv: ran.append((argv, os.environ[node_env.VAR])))
    node_env.main(["--", "python", "-m", "llmtrain.launch.node.agent"])
    assert ran == [(["python", "-m", "llmtrain.launch.node.agent"], "ens5")]


def test_readme_comma_value_and_list_overrides_compose():
    readme = (REPO / "docs" / "multinode.md").read_text()
    section = readme.split("## Multi-node launch", 1)[1].split("\n## ", 1)[0]
    env_arg = "\"+env.NCCL_DEBUG_SUBSYS='INIT,NET'\""
    extra_arg = "'cluster.sbatch_extra=[\"--exclusive\",\"--constraint=h100\"]'"
    assert env_arg in section and extra_arg in section
    cfg = slurm_cfg(*shlex.split(f"{env_arg} {extra_arg}"))
    assert cfg.env.NCCL_DEBUG_SUBSYS == "INIT,NET"
    assert list(cfg.cluster.sbatch_extra) == ["--exclusive", "--constraint=h100"]
    script = SlurmBackend(cfg, "/tmp/r").script()
    assert "export NCCL_DEBUG_SUBSYS=INIT,NET\n" in script
    assert "#SBATCH --exclusive\n#SBATCH --constraint=h100\n" in script


# ------------------------------------------------------------------------------------------------ ssh commands
def hostfile(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "hosts.txt"
    path.write_text(text)
    return path


def ssh_cfg(tmp_path: Path, hosts: str, *overrides: str):
    cfg = compose_here(["cluster=ssh", f"cluster.hostfile={hostfile(tmp_path, hosts)}", "device=cpu",
                          f"run.dir={tmp_path / 'run'}", *overrides])
    validate_here(cfg)
    return cfg


def test_ssh_port_is_a_free_local_one_when_the_launcher_is_the_head(tmp_path):
    cfg = ssh_cfg(tmp_path, "localhost slots=1\n", "cluster.nnodes=1")
    assert cfg.cluster.master_port == 0
    backend = SSHBackend(cfg, str(tmp_path / "run"))
    assert backend.port != 29500 and "free port of this host" in backend.port_origin
    assert f"rendezvous at localhost:{backend.port}" in backend.preview()
    assert f"--rdzv-endpoint=localhost:{backend.port}" in backend.node_commands()[0].argv


def test_ssh_port_is_random_and_said_when_the_head_is_elsewhere(tmp_path, monkeypatch):
    def unknown(*args, **kwargs):
        raise OSError("unknown host")

    monkeypatch.setattr(ssh.socket, "getaddrinfo", unknown)
    backend = SSHBackend(ssh_cfg(tmp_path, "node1 slots=1\nnode2 slots=1\n"), str(tmp_path / "run"))
    low, high = ssh.RANDOM_PORTS
    assert low <= backend.port <= high
    line = backend.endpoint_line()
    assert line.startswith(f"rendezvous at node1:{backend.port} (a random port") and "cluster.master_port" in line
    fixed = SSHBackend(ssh_cfg(tmp_path, "node1 slots=1\nnode2 slots=1\n", "cluster.master_port=29111"), "/r")
    assert fixed.endpoint_line() == "rendezvous at node1:29111 (cluster.master_port)"


def _fake_python(tmp_path: Path) -> Path:
    """Stands in for the node's python: records what the agent would have got."""
    path = tmp_path / "fake-python"
    path.write_text(f'#!/bin/sh\nprintf "%s\\n" "$LLMTRAIN_SETUP_MARK" "$@" > {tmp_path}/agent.txt\n')
    path.chmod(0o755)
    return path


@pytest.mark.parametrize("shell", ["sh", "bash"])
def test_ssh_remote_command_runs_setup_lines_in_order_then_the_agent(tmp_path, shell):
    work = tmp_path / "work"
    work.mkdir()
    cfg = ssh_cfg(tmp_path, "localhost slots=1\n", "cluster.nnodes=1", f"cluster.workdir={work}",
                  f"cluster.python={_fake_python(tmp_path)}")
    cfg.cluster.setup = ['export LLMTRAIN_SETUP_MARK="it\'s $((1 + 1))"  # a comment',
                         "echo one >> order.txt",
                         'echo "two $LLMTRAIN_SETUP_MARK" >> order.txt',
                         "cat >> order.txt"]  # stdin is the agent's control channel: not theirs to read
    backend = SSHBackend(cfg, str(tmp_path / "run"))
    argv = backend.ssh_argv(backend.node_commands()[0])
    assert argv[-2] == "localhost"
    result = subprocess.run([shell, "-c", argv[-1]], cwd="/", input="preempt\n", capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    assert (work / "order.txt").read_text() == "one\ntwo it's 2\n"
    agent = (tmp_path / "agent.txt").read_text().splitlines()
    assert agent[0] == "it's 2" and agent[1:3] == ["-m", "llmtrain.launch.node.agent"]


def test_ssh_failing_setup_line_stops_the_node_naming_it(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    cfg = ssh_cfg(tmp_path, "localhost slots=1\n", "cluster.nnodes=1", f"cluster.workdir={work}",
                  f"cluster.python={_fake_python(tmp_path)}")
    cfg.cluster.setup = ["echo one >> order.txt", "false", "echo three >> order.txt"]
    backend = SSHBackend(cfg, str(tmp_path / "run"))
    remote = backend.ssh_argv(backend.node_commands()[0])[-1]
    result = subprocess.run(["sh", "-c", remote], cwd="/", capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert result.stderr.strip() == "llmtrain: node set-up failed: cluster.setup line 2 (false) exited with status 1"
    assert (work / "order.txt").read_text() == "one\n" and not (tmp_path / "agent.txt").exists()


def test_hostfile_slots_set_nproc_per_node(tmp_path):
    cfg = ssh_cfg(tmp_path, "node1 slots=4\nnode2 slots=4\nnode3 slots=2\n")
    assert cfg.cluster.nproc_per_node == 4 and cfg.parallel.dp == 8
    assert ssh_cfg(tmp_path, "node1 slots=4\nnode2 slots=4\n", "cluster.nproc_per_node=2").cluster.nproc_per_node == 2
    with pytest.raises(ConfigError) as e:
        ssh_cfg(tmp_path, "node1 slots=4\nnode2 slots=4\n", "cluster.nproc_per_node=8")
    assert e.value.key == "cluster.nproc_per_node" and "exceeds the slots" in e.value.message


@pytest.mark.parametrize("overrides,key,words", [
    (["cluster=ssh", "cluster.nnodes=3"], "cluster.nproc_per_node", "node1 slots=4, node2 slots=4, node3 slots=2"),
    (["cluster=local", "cluster.nproc_per_node=null"], "cluster.nproc_per_node", "needs cluster=ssh"),
])
def test_slots_that_cannot_set_nproc_per_node_are_one_line(tmp_path, capsys, overrides, key, words):
    hosts = hostfile(tmp_path, "node1 slots=4\nnode2 slots=4\nnode3 slots=2\n")
    ssh_hosts = [f"cluster.hostfile={hosts}"] if "cluster=ssh" in overrides else []
    code = main(["launch", "--dry-run", *overrides, *ssh_hosts])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith(f"llmtrain: error: {key}:") and words in err, err
    if ssh_hosts:
        assert str(hosts) in err


@pytest.mark.parametrize("hosts,words", [
    ("node1 slots=4\nnode2 slots=0\n", "hosts.txt:2: node2 slots=0: a host runs at least one process (delete "
                                       "the line, or use cluster.exclude, to leave it out)"),
    ("node1 slots=1\n# a comment\nNODE1 slots=1\n",
     "hosts.txt:3: host NODE1 is listed twice: line 1 has node1 (host names are case-insensitive); keep one line"),
])
def test_a_hostfile_line_no_host_can_run_is_refused_naming_the_line(tmp_path, capsys, hosts, words):
    path = hostfile(tmp_path, hosts)
    code = main(["launch", "--dry-run", "cluster=ssh", f"cluster.hostfile={path}", "cluster.nnodes=1"])
    err = capsys.readouterr().err
    assert code == 2 and err == f"llmtrain: error: cluster.hostfile: {tmp_path}/{words}\n", err


def test_include_and_exclude_match_host_names_in_any_case(tmp_path):
    hosts = "Node1 slots=1\nnode2 slots=1\nnode3 slots=1\n"
    assert ssh_cfg(tmp_path, hosts, "cluster.nnodes=1", "cluster.include=NODE2").cluster.include == "NODE2"
    assert [h.name for h in cluster_hosts(ssh_cfg(tmp_path, hosts, "cluster.nnodes=1",
                                                  "cluster.include=node3").cluster)] == ["node3"]
    chosen = cluster_hosts(ssh_cfg(tmp_path, hosts, "cluster.nnodes=2", "cluster.exclude=NODE1").cluster)
    assert [h.name for h in chosen] == ["node2", "node3"]


# --------------------------------------------------------------------------------------------- sbatch refusals
@pytest.mark.parametrize("stderr,key", [
    ("sbatch: error: Batch job submission failed: Invalid generic resource (gres) specification",
     "cluster.gpus_per_node"),
    ("sbatch: error: Batch job submission failed: Invalid partition name specified", "cluster.partition"),
    ("sbatch: error: Batch job submission failed: Invalid account or account/partition combination specified",
     "cluster.account"),
    ("sbatch: error: Batch job submission failed: Requested time limit is invalid (missing or exceeds some limit)",
     "cluster.time"),
    ("sbatch: error: Invalid --time specification", "cluster.time"),
    ("sbatch: error: Batch job submission failed: Node count specification invalid", "cluster.nnodes"),
    ("sbatch: error: CPU count per node can not be satisfied\n"
     "sbatch: error: Batch job submission failed: Requested node configuration is not available",
     "cluster.cpus_per_node"),
    ("sbatch: error: Batch job submission failed: Invalid qos specification", "cluster.sbatch_extra"),
    ("sbatch: error: Batch job submission failed: Invalid feature specification", "cluster.sbatch_extra"),
    ("sbatch: unrecognized option '--exclusiv'", "cluster.sbatch_extra"),
])
def test_sbatch_refusal_names_the_key_behind_it(tmp_path, fake, stderr, key):
    fake(sbatch=(1, "", stderr + "\n"))
    backend = SlurmBackend(slurm_cfg("cluster.gpus_per_node=8"), str(tmp_path / "run"))
    with pytest.raises(ConfigError) as e:
        backend.submit()
    assert e.value.key == key
    assert e.value.message.endswith(stderr.splitlines()[-1]), e.value.message
    assert f"({key}=" in e.value.message


@pytest.mark.parametrize("stderr", [
    "sbatch: error: Batch job submission failed: Requested node configuration is not available",
    "sbatch: error: Batch job submission failed: Job violates accounting/QOS policy (job submit limit, user's size "
    "and/or time limits)"])
def test_ambiguous_sbatch_refusal_names_what_was_asked(tmp_path, fake, stderr):
    fake(sbatch=(1, "", stderr))
    with pytest.raises(ConfigError) as e:
        SlurmBackend(slurm_cfg("cluster.gpus_per_node=8"), str(tmp_path / "run")).submit()
    assert e.value.key == "cluster"
    assert "cluster.nnodes=2, cluster.gpus_per_node=8, cluster.cpus_per_node=1, cluster.time=04:00:00" \
        in e.value.message and e.value.message.endswith(stderr)


# ----------------------------------------------------------------------------------------- pending reasons
@pytest.mark.parametrize("reason,nnodes,part,why", [
    ("PartitionNodeLimit", "3-3", partition(total=2), "cluster.nnodes=3, but partition debug has 2 node(s)"),
    ("PartitionNodeLimit", "3", partition(total=8, max_nodes="2"),
     "cluster.nnodes=3, but partition debug allows 2 node(s) per job"),
    ("PartitionNodeLimit", "2-2", partition(total=2), None),  # the partition's nodes are down: it may start later
    ("PartitionNodeLimit", "3-3", None, None),                # the partition could not be read: keep waiting
    ("PartitionConfig", "3-3", partition(total=2), "cluster.nnodes=3, but partition debug has 2 node(s)"),
    ("PartitionConfig", "2-2", partition(total=2), None),
    ("InvalidAccount", "2-2", partition(), "check cluster.account"),
    ("PartitionTimeLimit", "2-2", partition(), "check cluster.time"),
    ("QOSMaxNodePerJobLimit", "2-2", partition(), "check cluster.nnodes"),
    ("Priority", "2-2", partition(), None),
    ("Resources", "2-2", partition(), None),
    ("QOSMaxJobsPerUserLimit", "2-2", partition(), None),
])
def test_pending_reason_classifier(reason, nnodes, part, why):
    fields = parse_text(job(reason=reason, nnodes=nnodes))
    assert fields["JobState"] == "PENDING" and fields["AllocNode:Sid"] == "head:1234"
    said = slurm.never_starts(fields, parse_text(part) if part else None)
    if why is None:
        assert said is None
    else:
        assert said == f"Reason={reason}: {why}"


# ------------------------------------------------------------------------------------------- the follower
def test_follower_shows_reasons_and_cancels_a_job_that_never_starts(tmp_path, fake, monkeypatch):
    f = fake(jobs=[job(reason="None"), job(reason="Priority"), job(reason="Priority"),
                   job(reason="PartitionNodeLimit", nnodes="3-3")])
    reported = []
    monkeypatch.setattr(slurm, "report_failure", lambda *a, **k: reported.append(a))
    monitor = FakeMonitor()
    # A global batch that 3 nodes of one process each divide: the default (16) is refused before any submission.
    backend = SlurmBackend(slurm_cfg("cluster.follow=true", "cluster.nnodes=3", "train.global_batch_size=12"),
                           str(tmp_path / "run"))
    assert backend.run(monitor) == 1
    lines = [ln for ln in monitor.text.splitlines() if ln.startswith("llmtrain: job 123")]
    assert lines == ["llmtrain: job 123 PENDING",
                     "llmtrain: job 123 PENDING (Reason=Priority)",
                     "llmtrain: job 123 PENDING (Reason=PartitionNodeLimit)",
                     "llmtrain: job 123 can never start (Reason=PartitionNodeLimit: cluster.nnodes=3, but partition "
                     "debug has 2 node(s)); cancelled it"]
    assert f.scancels() == [["scancel", "123"]] and not reported and not backend.finished_job


def test_follower_names_the_endpoint_and_the_job_end(tmp_path, fake):
    fake(jobs=[job(), job(state="RUNNING", nodes="node[1-2]"), job(state="COMPLETED", nodes="node[1-2]")])
    monitor = FakeMonitor()
    backend = SlurmBackend(slurm_cfg("cluster.follow=true"), str(tmp_path / "run"))
    assert backend.run(monitor) == 0 and backend.finished_job
    assert "llmtrain: submitted Slurm job 123 (" in monitor.text and "port 20123" in monitor.text
    assert "llmtrain: job 123 RUNNING on node[1-2]; rendezvous at node1:20123\n" in monitor.text
    assert "llmtrain: job 123 COMPLETED\n" in monitor.text


def test_ctrl_c_stops_following_and_leaves_the_job_running(tmp_path, fake):
    f = fake(jobs=[job(state="RUNNING", nodes="node[1-2]")])
    monitor = FakeMonitor(interrupt_at=2)
    run_dir = tmp_path / "run"
    backend = SlurmBackend(slurm_cfg("cluster.follow=true"), str(run_dir))
    try:
        code = backend.run(monitor)
    except KeyboardInterrupt:  # not re-raised: it would end the whole pytest session
        pytest.fail("Ctrl-C escaped the Slurm follower")
    assert code == 0 and not backend.finished_job
    assert monitor.text.strip().splitlines()[-1] == (
        f"llmtrain: stopped following job 123; it keeps running (llmtrain cancel {run_dir} or scancel 123 to stop it)")
    assert not f.scancels() and backend.job_holding_run_dir() == "123"


@pytest.mark.parametrize("scancel,said", [
    (None, "cancelled it"),
    (subprocess.TimeoutExpired(["scancel"], 20), "could not cancel it (scancel did not answer within 20 s)")])
def test_sigterm_to_a_follower_of_a_pending_job_cancels_it(tmp_path, fake, scancel, said):
    f = fake(jobs=[job(reason="Priority")], scancel=scancel)
    monitor = FakeMonitor()
    backend = SlurmBackend(slurm_cfg(), str(tmp_path / "run"))
    backend.console, backend.job_id = monitor.console, "123"
    assert backend.signal_workers(10) == 0
    assert f.scancels() == [["scancel", "123"]]
    assert f"llmtrain: job 123 is PENDING: no worker to checkpoint; {said}" in monitor.text


def test_sigterm_to_a_follower_of_a_running_job_signals_its_steps(tmp_path, fake):
    f = fake(jobs=[job(state="RUNNING", nodes="node[1-2]")])
    backend = SlurmBackend(slurm_cfg(), str(tmp_path / "run"))
    backend.job_id = "123"
    assert backend.signal_workers(10) == 1
    assert f.scancels() == [["scancel", "--signal=USR1", "123"]]  # not --full: the batch shell would die of USR1


def test_a_silent_scontrol_neither_ends_nor_hangs_the_follower(tmp_path, monkeypatch):
    def silent(argv, **kwargs):
        raise subprocess.TimeoutExpired(argv, kwargs["timeout"])

    monkeypatch.setattr(slurm.subprocess, "run", silent)
    backend = SlurmBackend(slurm_cfg(), str(tmp_path / "run"))
    backend.job_id = "123"
    assert backend.job_info() is None and backend.job_holding_run_dir() == "123"


def _fake_slurm_tools(tmp_path: Path, monkeypatch, sbatch: str) -> None:
    _fake_bin(tmp_path, "sbatch", sbatch)
    _fake_bin(tmp_path, "scontrol", 'echo "JobId=$3 JobName=x"; echo "   JobState=PENDING Reason=Priority"\n')
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")


def test_submission_without_follow_says_how_to_follow_and_cancel(tmp_path, monkeypatch, capsys):
    _fake_slurm_tools(tmp_path, monkeypatch, "echo 4242\n")
    run_dir = tmp_path / "run"
    assert main(["launch", f"run.dir={run_dir}", "cluster=slurm", "cluster.nnodes=1", "device=cpu",
                 "train.max_steps=1"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"submitted Slurm job 4242 \(.*\); rendezvous on the job's first node, port 24242", out), out
    assert f"follow it: squeue -j 4242, or llmtrain follow {run_dir}" in out
    assert f"cancel it: scancel 4242, or llmtrain cancel {run_dir}" in out
    assert "job finished" not in out


def test_sbatch_refusal_through_launch_is_one_line_naming_the_key(tmp_path, monkeypatch, capsys):
    _fake_slurm_tools(tmp_path, monkeypatch, 'echo "sbatch: error: Batch job submission failed: Invalid generic '
                                             'resource (gres) specification" >&2; exit 1\n')
    code = main(["launch", f"run.dir={tmp_path / 'run'}", "cluster=slurm", "cluster.nnodes=1",
                 "cluster.gpus_per_node=8", "device=cpu", "train.max_steps=1"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith("llmtrain: error: cluster.gpus_per_node: sbatch refused the job (cluster.gpus_per_node=8): "
                          "sbatch: "
                          "error: Batch job submission failed: Invalid generic resource (gres) specification"), err
    assert not (tmp_path / "run").exists()
