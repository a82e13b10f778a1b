"""`llmtrain doctor`: reachability of every host before any job starts (ssh), Slurm node states from sinfo, the
interface and address per node, all-reduce and all-to-all bandwidth intra-node / inter-node / all, and a results
folder of its own. The tests use fake ssh/sinfo/sbatch programs on PATH; test_cluster_doctor.py runs it on the
two-node test cluster."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import time
from pathlib import Path

import pytest
from conftest import run_cli
from omegaconf import OmegaConf

from llmtrain.doctor.command import results_dir
from llmtrain.doctor.all_reduce_sweeps import bus_bandwidth, plan_sweeps
from llmtrain.doctor.all_to_all_sweeps import all_to_all_bus_factor, all_to_all_sizes
from llmtrain.doctor.node_availability import unreachable_advice
from llmtrain.doctor.findings import bandwidth_lines, bandwidth_table, problems
from llmtrain.console import get_console
from llmtrain.launch.backends import reachability
from llmtrain.launch.node.collective_interface import named_interface
from llmtrain.slurm.node_states import NodeState, parse_sinfo, parse_state
from llmtrain.launch.backends.ssh_options import ssh_base

BAD_HOST = "nonexistent-host.invalid"
RESOLVE_ERROR = f"ssh: Could not resolve hostname {BAD_HOST}: Name or service not known"


def fake_program(folder: Path, name: str, body: str) -> Path:
    """An executable `name` in `folder` that appends its arguments (and the time) to folder/NAME.calls."""
    folder.mkdir(exist_ok=True)
    path = folder / name
    path.write_text(f'#!/bin/bash\necho "$(date +%s.%N) $*" >> {folder}/{name}.calls\n{body}\n')
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def calls(folder: Path, name: str) -> list[str]:
    path = folder / f"{name}.calls"
    return path.read_text().splitlines() if path.exists() else []


def with_path(folder: Path) -> dict[str, str]:
    return {"PATH": f"{folder}{os.pathsep}{os.environ['PATH']}"}


# ---------------------------------------------------------------------------------------------- reachability (ssh)
def ssh_options(**cluster) -> str:
    """The options the launcher's ssh gets (ssh_options.ssh_base), as the fake ssh records them."""
    keys = {"ssh_config": None, "ssh_port": None, "ssh_identity": None, "ssh_user": None}
    return " ".join(ssh_base(OmegaConf.create({**keys, **cluster}))[1:])


FAKE_SSH = f"""for last; do :; done
for a in "$@"; do
  case "$a" in
    {BAD_HOST}) sleep 0.3; echo "{RESOLVE_ERROR}" >&2; exit 255 ;;
    down-*) sleep 1; echo "ssh: connect to host $a port 22: Connection timed out" >&2; exit 255 ;;
  esac
done
exit 0"""


def test_unreachable_host_is_named_and_nothing_starts(tmp_path):
    bin_dir = tmp_path / "bin"
    fake_program(bin_dir, "ssh", FAKE_SSH)
    hostfile = tmp_path / "hosts.txt"
    hostfile.write_text(f"good-host slots=1\n{BAD_HOST} slots=1\n")
    result = run_cli(["doctor", "cluster=ssh", f"cluster.hostfile={hostfile}", "cluster.nnodes=2",
                      "cluster.nproc_per_node=1", f"doctor.dir={tmp_path / 'doctor'}", f"run.dir={tmp_path / 'run'}"],
                     env=with_path(bin_dir), timeout=60)
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 2, result.stdout
    took = re.fullmatch(rf"{re.escape(BAD_HOST)}: unreachable after (\d+\.\d) s \({re.escape(RESOLVE_ERROR)}\)",
                        lines[0])
    assert took and 0.3 <= float(took[1]) < 5, lines[0]
    assert lines[1] == (f"llmtrain doctor: 1 of 2 host(s) of {hostfile} cannot be reached over ssh; nothing was "
                        f"started (cluster.exclude={BAD_HOST} leaves them out, with cluster.nnodes=1: 1 host(s) "
                        "left)")
    # Only the probes ran: one per host, each the launcher's own ssh options + `-o ConnectTimeout=10 HOST true`.
    probes = [c.split(" ", 1)[1] for c in calls(bin_dir, "ssh")]
    options = ssh_options()
    assert sorted(probes) == sorted(f"{options} -o ConnectTimeout=10 {h} true" for h in ("good-host", BAD_HOST))
    assert not (tmp_path / "doctor").exists() and not (tmp_path / "run").exists()


def test_hosts_are_probed_in_parallel_with_ssh_options(tmp_path):
    bin_dir = tmp_path / "bin"
    fake_program(bin_dir, "ssh", FAKE_SSH)
    hostfile = tmp_path / "hosts.txt"
    hostfile.write_text("".join(f"down-{i} slots=1\n" for i in range(4)))
    result = run_cli(["doctor", "cluster=ssh", f"cluster.hostfile={hostfile}", "cluster.nnodes=2",
                      "cluster.nproc_per_node=1", "cluster.ssh_port=2200", "cluster.ssh_user=me",
                      f"cluster.ssh_config={tmp_path / 'ssh_config'}", "doctor.connect_timeout_s=3",
                      f"doctor.dir={tmp_path / 'doctor'}"], env=with_path(bin_dir), timeout=60)
    assert result.returncode == 1, result.stdout + result.stderr
    named = [ln for ln in result.stdout.splitlines() if "unreachable" in ln]
    assert [ln.split(":")[0] for ln in named] == [f"down-{i}" for i in range(4)]  # hostfile order
    for i, line in enumerate(named):
        assert re.fullmatch(rf"down-{i}: unreachable after 1\.\d s \(ssh: connect to host down-{i} port 22: "
                            r"Connection timed out\)", line), line
    starts = sorted(float(c.split(" ", 1)[0]) for c in calls(bin_dir, "ssh"))
    assert len(starts) == 4 and starts[-1] - starts[0] < 0.9, starts  # all four at once, not one after another
    options = ssh_options(ssh_config=str(tmp_path / "ssh_config"), ssh_port=2200, ssh_user="me")
    assert "-o BatchMode=yes" in options and f"-F {tmp_path / 'ssh_config'}" in options and "-l me" in options
    assert sorted(c.split(" ", 1)[1] for c in calls(bin_dir, "ssh")) == [
        f"{options} -o ConnectTimeout=3 down-{i} true" for i in range(4)]
    assert result.stdout.splitlines()[-1].startswith(f"llmtrain doctor: none of the 4 host(s) of {hostfile} can be "
                                                     "reached over ssh; nothing was started: check the host names")


def test_a_stalled_ssh_is_stopped_and_named(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    fake_program(bin_dir, "ssh", "sleep 60 & wait")  # a child holding the pipes, as a ProxyCommand would
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(reachability, "STALL_MARGIN_S", 0.5)
    cluster = OmegaConf.create({"ssh_config": None, "ssh_port": None, "ssh_identity": None, "ssh_user": None})
    start = time.monotonic()
    [check] = reachability.check_hosts(cluster, ["stuck"], connect_timeout_s=1)
    # Stopped at 1 s + the 0.5 s margin; a busy machine may run the stop a little late, never early.
    assert time.monotonic() - start < 6
    assert re.fullmatch(r"stuck: unreachable after (1\.[5-9]|2\.\d) s \(no answer within 1\.5 s; ssh was stopped\)",
                        check.line()), check.line()


def test_ssh_failures_keep_sshs_own_words():
    assert reachability.why_failed(255, "Warning: Permanently added 'n1' (ED25519) to the list of known hosts.\r\n"
                                        "root@n1: Permission denied (publickey).\n") == \
        "root@n1: Permission denied (publickey)."
    assert reachability.why_failed(1, "bash: /etc/profile: Input/output error\n") == \
        "connected, but the remote shell exited with status 1: bash: /etc/profile: Input/output error"


@pytest.mark.skipif(shutil.which("ssh") is None, reason="no ssh client on this machine")
@pytest.mark.parametrize("hosts,down,exclude,nnodes,advice", [
    (["node1", "node2", "node3"], ["node2"], None, 2,
     "1 of 3 host(s) of hosts.txt cannot be reached over ssh; nothing was started (cluster.exclude=node2 leaves "
     "them out)"),
    (["node1", "node2", "node3"], ["node2", "node3"], "node4", 2,
     "2 of 3 host(s) of hosts.txt cannot be reached over ssh; nothing was started (cluster.exclude=node4,node2,"
     "node3 leaves them out, with cluster.nnodes=1: 1 host(s) left)"),
    (["node1", "node2"], ["node1", "node2"], None, 2,
     "none of the 2 host(s) of hosts.txt can be reached over ssh; nothing was started: check the host names in the "
     "hostfile, that they resolve from here (getent hosts NAME), and the ssh settings (cluster.ssh_user, "
     "cluster.ssh_port, cluster.ssh_identity, cluster.ssh_config, ~/.ssh/config)"),
])
def test_unreachable_advice_never_excludes_every_host(hosts, down, exclude, nnodes, advice):
    cluster = OmegaConf.create({"hostfile": "hosts.txt", "exclude": exclude, "nnodes": nnodes})
    assert unreachable_advice(cluster, hosts, down) == advice


def test_real_ssh_names_an_unresolvable_host(tmp_path):
    hostfile = tmp_path / "hosts.txt"
    hostfile.write_text(f"{BAD_HOST} slots=1\n")
    start = time.monotonic()
    result = run_cli(["doctor", "cluster=ssh", f"cluster.hostfile={hostfile}", "cluster.nnodes=1",
                      "cluster.nproc_per_node=1", f"doctor.dir={tmp_path / 'doctor'}"], timeout=60)
    assert result.returncode == 1 and time.monotonic() - start < 20, result.stdout + result.stderr
    first = result.stdout.splitlines()[0]
    assert re.fullmatch(rf"{re.escape(BAD_HOST)}: unreachable after \d+\.\d s \(ssh: Could not resolve hostname "
                        rf"{re.escape(BAD_HOST)}: [^)]+\)", first), first
    assert not (tmp_path / "doctor").exists()


# ---------------------------------------------------------------------------------------------- Slurm (sinfo)
SINFO = """node1|idle|debug*|none
node2|drained|debug*|disk failure
node3|idle*|debug*|Not responding
node4|mixed~|debug*|none
node1|idle|gpu|none
node5|down*|gpu|Node unexpectedly rebooted
"""


def test_sinfo_default_partition_and_node_states():
    partition, nodes = parse_sinfo(SINFO, None)
    assert partition == "debug"
    assert nodes == [NodeState("node1", "idle", False, None), NodeState("node2", "drained", False, "disk failure"),
                     NodeState("node3", "idle", True, "Not responding"), NodeState("node4", "mixed", False, None)]
    assert [n.usable for n in nodes] == [True, False, False, True]
    assert [n.line() for n in nodes if not n.usable] == ["node2: drained (disk failure)",
                                                         "node3: idle, not responding (Not responding)"]
    partition, nodes = parse_sinfo(SINFO, "gpu")
    assert partition == "gpu" and [n.line() for n in nodes] == [
        "node1: idle", "node5: down, not responding (Node unexpectedly rebooted)"]
    assert parse_state("DRAINING") == ("draining", False) and parse_state("allocated#") == ("allocated", False)
    assert parse_sinfo("", "nopart") == ("nopart", [])


def slurm_tools(bin_dir: Path, sinfo_output: str) -> None:
    fake_program(bin_dir, "sinfo", f"cat <<'EOF'\n{sinfo_output}EOF")
    for tool in ("sbatch", "scontrol", "scancel"):
        fake_program(bin_dir, tool, "exit 1")


def test_slurm_with_too_few_usable_nodes_submits_nothing(tmp_path):
    bin_dir = tmp_path / "bin"
    slurm_tools(bin_dir, SINFO)
    args = ["doctor", "cluster=slurm", "cluster.nproc_per_node=1", "device=cpu", f"doctor.dir={tmp_path / 'doctor'}"]
    result = run_cli([*args, "cluster.nnodes=3"], env=with_path(bin_dir), timeout=60)
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stdout.splitlines() == [
        "node2: drained (disk failure)",
        "node3: idle, not responding (Not responding)",
        "llmtrain doctor: partition debug: 2 of 4 node(s) usable, fewer than cluster.nnodes=3: the job could not "
        "start; nothing was submitted"]
    assert [c.split(" ", 1)[1] for c in calls(bin_dir, "sinfo")] == ["-h -N -o %N|%T|%P|%E"]
    assert calls(bin_dir, "sbatch") == [] and not (tmp_path / "doctor").exists()

    result = run_cli([*args, "cluster.nnodes=2", "cluster.partition=gpu"], env=with_path(bin_dir), timeout=60)
    assert result.returncode == 1 and calls(bin_dir, "sbatch") == []
    assert calls(bin_dir, "sinfo")[-1].split(" ", 1)[1] == "-h -N -o %N|%T|%P|%E -p gpu"
    assert result.stdout.splitlines() == [
        "node5: down, not responding (Node unexpectedly rebooted)",
        "llmtrain doctor: partition gpu: 1 of 2 node(s) usable, fewer than cluster.nnodes=2: the job could not "
        "start; nothing was submitted"]

    # Enough usable nodes: the job is submitted (this sbatch refuses it, which leaves no doctor folder behind).
    result = run_cli([*args, "cluster.nnodes=1", "cluster.partition=gpu"], env=with_path(bin_dir), timeout=60)
    assert result.stdout.splitlines()[:2] == ["node5: down, not responding (Node unexpectedly rebooted)",
                                              "llmtrain doctor: partition gpu: 1 of 2 node(s) usable (node1); "
                                              "cluster.nnodes=1"]
    assert result.returncode == 2 and len(calls(bin_dir, "sbatch")) == 1, result.stdout + result.stderr
    assert result.stderr.startswith("llmtrain: error: cluster: sbatch refused the job")
    assert list((tmp_path / "doctor").iterdir()) == []


# ---------------------------------------------------------------------------------------------- interfaces, bandwidth
def test_interface_variables_select_like_gloo_and_nccl():
    found = ["lo", "eth0", "eth1", "ib0", "docker0"]
    assert named_interface("NCCL_SOCKET_IFNAME", "^lo,docker", found) == "eth0"
    assert named_interface("NCCL_SOCKET_IFNAME", "ib", found) == "ib0"  # NCCL: a prefix
    assert named_interface("NCCL_SOCKET_IFNAME", "=eth1", found) == "eth1"
    assert named_interface("GLOO_SOCKET_IFNAME", "eth1,eth0", found) == "eth1"  # gloo: a name
    assert named_interface("GLOO_SOCKET_IFNAME", "^lo,eth,ib", found) == "docker0"


def test_sweep_scopes_by_layout():
    two_by_two = [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert plan_sweeps(two_by_two) == [{"scope": "intra-node", "groups": [[0, 1], [2, 3]]},
                                       {"scope": "inter-node", "groups": [[0, 2]]},
                                       {"scope": "all", "groups": [[0, 1, 2, 3]]}]
    assert plan_sweeps([(0, 0), (1, 0)]) == [{"scope": "intra-node", "skipped": "one process per node"},
                                             {"scope": "inter-node", "groups": [[0, 1]]},
                                             {"scope": "all", "same_as": "inter-node"}]
    assert plan_sweeps([(0, 0), (0, 1)]) == [{"scope": "intra-node", "groups": [[0, 1]]},
                                             {"scope": "inter-node", "skipped": "one node"},
                                             {"scope": "all", "same_as": "intra-node"}]
    # Ranks of a node need not be consecutive; local rank 0 speaks for its node.
    assert plan_sweeps([(1, 1), (0, 0), (1, 0), (0, 1)])[:2] == [
        {"scope": "intra-node", "groups": [[1, 3], [0, 2]]}, {"scope": "inter-node", "groups": [[1, 2]]}]


def test_all_to_all_sizes_and_bus_bandwidth():
    # Every other all-reduce size from the largest down: the largest is always measured.
    assert all_to_all_sizes([1024, 4096, 16384, 65536]) == [4096, 65536]
    assert all_to_all_sizes([4**k for k in range(5, 15)]) == [4096, 65536, 2**20, 2**24, 2**28]
    assert all_to_all_sizes([1024]) == [1024]
    # nccl-tests: all-to-all busbw = algbw x (n-1)/n; all-reduce busbw = algbw x 2(n-1)/n.
    assert [all_to_all_bus_factor(n) for n in (1, 2, 4, 8)] == [0.0, 0.5, 0.75, 0.875]
    assert [bus_bandwidth(1.0, n) for n in (1, 2, 4, 8)] == [0.0, 1.0, 1.5, 1.75]


def rows(*busbw: float) -> list[dict]:
    return [{"bytes": 1024 * 4**i, "time_us": 1.0, "algbw_gbs": b, "busbw_gbs": b} for i, b in enumerate(busbw)]


def rank(node: int, host: str, address: str) -> dict:
    return {"node": node, "host": host, "python": "3.11", "torch": "2.13", "cuda": None, "nccl": None,
            "cuda_available": False, "env": {},
            "interfaces": [{"backend": "gloo", "variable": "GLOO_SOCKET_IFNAME", "interface": "eth0",
                            "address": address, "via": "route to n1"}]}


def test_bandwidth_lines_name_each_scope_and_the_slowest_node():
    report = {"ranks": [rank(0, "n1", "10.0.0.1"), rank(0, "n1", "10.0.0.1"), rank(1, "n2", "10.0.0.2"),
                        rank(1, "n2", "10.0.0.2")],
              "sizes": [1024, 4096],
              "sweeps": [{"scope": "intra-node", "results": [{"ranks": [0, 1], "node": 0, "rows": rows(1.0, 9.0)},
                                                             {"ranks": [2, 3], "node": 1, "rows": rows(2.0, 5.0)}]},
                         {"scope": "inter-node", "results": [{"ranks": [0, 2], "node": 0, "rows": rows(0.5, 0.25)}]},
                         {"scope": "all", "results": [{"ranks": [0, 1, 2, 3], "node": 0, "rows": rows(0.1, 0.75)}]}]}
    assert bandwidth_lines(report) == [
        "intra-node: 5.000 GB/s at 4 KiB (2 ranks on each of 2 nodes; slowest node n2)",
        "inter-node: 0.500 GB/s at 1 KiB (1 rank on each of 2 nodes)",
        "all: 0.750 GB/s at 4 KiB (4 ranks)"]
    cfg = OmegaConf.create({"cluster": {"nnodes": 2, "nproc_per_node": 2}, "device": "cpu"})
    assert problems(report, cfg) == []
    report["ranks"][2]["interfaces"][0].update(interface="lo", address="127.0.1.1")
    assert problems(report, cfg) == ["node 1 (n2), gloo: route to n1 is lo (127.0.1.1), a loopback address the other "
                                     "nodes cannot reach; set +env.GLOO_SOCKET_IFNAME=NAME"]


def test_all_to_all_lines_and_table_show_busbw_and_algbw():
    # One rank on each of 3 nodes: equal splits of 3 send a little under the size asked for (85 x 3 fp32 = 1020
    # bytes of 1 KiB); the lines and the table name the size asked for. algbw = busbw x n/(n-1) = busbw x 1.5.
    report = {"ranks": [rank(n, f"n{n + 1}", f"10.0.0.{n + 1}") for n in range(3)],
              "sizes": [1024, 4096, 16384], "all_to_all_sizes": [1024, 16384],
              "all_to_all_sweeps": [
                  {"scope": "intra-node", "skipped": "one process per node"},
                  {"scope": "inter-node", "results": [{"ranks": [0, 1, 2], "node": 0, "rows": [
                      {"bytes": 1020, "time_us": 2.0, "algbw_gbs": 0.51, "busbw_gbs": 0.34},
                      {"bytes": 16380, "time_us": 8.0, "algbw_gbs": 2.046, "busbw_gbs": 1.364}]}]},
                  {"scope": "all", "same_as": "inter-node"}]}
    assert bandwidth_lines(report, "all_to_all") == [
        "intra-node: not measured (one process per node)",
        "inter-node: 1.364 GB/s at 16 KiB, algbw 2.046 GB/s (1 rank on each of 3 nodes)",
        "all: the same ranks as inter-node"]
    table = bandwidth_table(report, "all_to_all")
    assert table.title == "all_to_all bandwidth (GB/s) per message size, busbw / algbw; intra-node: the slowest node"
    console = get_console(record=True, width=200)
    console.print(table)
    text = console.export_text()
    assert re.search(r"^│ +1,024 │ +0\.340 / 0\.510 │$", text, re.M), text
    assert re.search(r"^│ +16,384 │ +1\.364 / 2\.046 │$", text, re.M), text


# ---------------------------------------------------------------------------------------------- results folder
def test_results_folder_is_new_per_check(tmp_path):
    now = time.mktime((2025, 3, 4, 5, 6, 7, 0, 0, -1))
    first, second = results_dir(str(tmp_path / "doc"), now), results_dir(str(tmp_path / "doc"), now)
    assert first == str(tmp_path / "doc" / "20250304-050607") and second == first + "-2"
    assert os.listdir(first) == [] and os.listdir(second) == []


@pytest.mark.slow
def test_local_doctor_writes_its_own_folder_and_leaves_run_dirs_alone(tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / "logs").mkdir(parents=True)
    (run_dir / "config.yaml").write_text("a run's config\n")
    (run_dir / ".lock").write_text('{"host": "elsewhere", "pid": 1}\n')
    before = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    result = run_cli(["doctor", f"run.dir={run_dir}", f"doctor.dir={tmp_path / 'doctor'}", "--max-bytes", "65536",
                      "--iters", "2"], timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()} == before
    [folder] = list((tmp_path / "doctor").iterdir())
    assert re.fullmatch(r"\d{8}-\d{6}", folder.name)
    lines = result.stdout.splitlines()
    assert lines[0] == f"llmtrain doctor: 1 node(s) x 2 process(es) via local; results in {folder}"
    assert lines[-1] == f"llmtrain doctor: report in {folder / 'report.json'}"
    report = json.loads((folder / "report.json").read_text())
    assert report["ok"] is True and report["problems"] == [] and len(report["ranks"]) == 2
    assert {p.name for p in (folder / "logs").iterdir()} >= {"node0.env", "node0.log", "rank0.log", "rank1.log"}
    assert re.search(r"^  intra-node: \d+\.\d{3} GB/s at \d+ KiB \(2 ranks on one node\)$", result.stdout, re.M)
    assert "  inter-node: not measured (one node)\n  all: the same ranks as intra-node\n" in result.stdout
    # The all-to-all beside it, at every other size from the largest down: 4 KiB and 64 KiB of 1, 4, 16, 64 KiB.
    a2a = re.search(r"^all_to_all bandwidth, best over the sweep \(equal splits, fp32; busbw = algbw x \(n-1\)/n\):\n"
                    r"  intra-node: (\d+\.\d{3}) GB/s at (4|64) KiB, algbw (\d+\.\d{3}) GB/s \(2 ranks on one node\)\n"
                    r"  inter-node: not measured \(one node\)\n  all: the same ranks as intra-node\n",
                    result.stdout, re.M)
    assert a2a and float(a2a[1]) > 0, result.stdout[-3000:]
    assert report["all_to_all_sizes"] == [4096, 65536] and report["sizes"] == [1024, 4096, 16384, 65536]
    [a2a_rows] = [res["rows"] for s in report["all_to_all_sweeps"] for res in s.get("results", [])]
    assert [row["bytes"] for row in a2a_rows] == [4096, 65536]
    for row in a2a_rows:  # 2 ranks: half of each rank's data leaves it
        assert row["time_us"] > 0 and row["algbw_gbs"] > 0 and row["busbw_gbs"] == pytest.approx(row["algbw_gbs"] / 2)
    assert float(a2a[3]) == pytest.approx(2 * float(a2a[1]), abs=0.002)
