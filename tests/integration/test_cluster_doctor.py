"""`llmtrain doctor` on the two-node test cluster (scripts/testcluster.sh): over ssh, with a node whose link is
down, and under Slurm with a drained node."""

from __future__ import annotations

import json
import re
import subprocess
import time

import pytest
from conftest import run_cli, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.cluster]


def ssh_doctor(cluster, tmp_path, hosts: str, *extra: str, timeout: float = 300):
    hostfile = tmp_path / "hosts.txt"
    hostfile.write_text(hosts)
    return run_cli(["doctor", "cluster=ssh", f"cluster.hostfile={hostfile}", f"cluster.ssh_config={cluster.ssh_config}",
                    "cluster.nnodes=2", "launch.pg_timeout_s=120", f"doctor.dir={tmp_path / 'doctor'}", *extra],
                   env=cluster.env, timeout=timeout)


def test_doctor_over_ssh_reports_interfaces_and_three_bandwidths(cluster, tmp_path):
    result = ssh_doctor(cluster, tmp_path, "node1 slots=2\nnode2 slots=2\n", "cluster.nproc_per_node=2",
                        "--max-bytes", "1048576", "--iters", "2")
    out = result.stdout
    assert result.returncode == 0, out[-4000:] + result.stderr[-2000:]
    assert out.startswith("llmtrain doctor: 2 host(s) answered over ssh (node1, node2; slowest ")
    for node, host in ((0, "node1"), (1, "node2")):
        row = rf"^│ {node} +│ {host} +│ gloo +│ eth0 +│ 10\.200\.0\.1{node + 1} +│ route to \S+ +│$"
        assert re.search(row, out, re.M), out[-4000:]
    assert re.search(r"^  intra-node: \d+\.\d{3} GB/s at \d+ [KM]iB \(2 ranks on each of 2 nodes; slowest node "
                     r"node[12]\)$", out, re.M), out[-2000:]
    assert re.search(r"^  inter-node: \d+\.\d{3} GB/s at \d+ [KM]iB \(1 rank on each of 2 nodes\)$", out, re.M)
    assert re.search(r"^  all: \d+\.\d{3} GB/s at \d+ [KM]iB \(4 ranks\)$", out, re.M)
    [folder] = list((tmp_path / "doctor").iterdir())
    report = json.loads((folder / "report.json").read_text())
    assert report["ok"] is True and [r["host"] for r in report["ranks"]] == ["node1", "node1", "node2", "node2"]
    assert [len(s["results"]) for s in report["sweeps"]] == [2, 1, 1]
    assert all(row["busbw_gbs"] > 0 for s in report["sweeps"] for res in s["results"] for row in res["rows"])
    # The all-to-all beside it, on the same groups, at 4 KiB, 64 KiB and 1 MiB; busbw = algbw x (n-1)/n.
    best = r"\d+\.\d{3} GB/s at (?:4 KiB|64 KiB|1 MiB), algbw \d+\.\d{3} GB/s"
    a2a_lines = re.search(rf"^all_to_all bandwidth, .*\n  intra-node: {best} \(2 ranks on each of 2 nodes; slowest "
                          rf"node node[12]\)\n  inter-node: {best} \(1 rank on each of 2 nodes\)\n  all: {best} "
                          r"\(4 ranks\)$", out, re.M)
    assert a2a_lines, out[-2000:]
    assert report["all_to_all_sizes"] == [4096, 65536, 2**20]
    a2a = report["all_to_all_sweeps"]
    assert [s["scope"] for s in a2a] == ["intra-node", "inter-node", "all"]
    assert [len(s["results"]) for s in a2a] == [2, 1, 1]
    for s in a2a:
        for res in s["results"]:
            n = len(res["ranks"])
            assert [row["bytes"] for row in res["rows"]] == [4096, 65536, 2**20]
            assert all(row["algbw_gbs"] > 0 and row["busbw_gbs"] == pytest.approx(row["algbw_gbs"] * (n - 1) / n)
                       for row in res["rows"])


def test_doctor_names_a_node_whose_link_is_down_in_seconds(cluster, tmp_path):
    # node2's side of the bridge goes down: its sshd can no longer be reached (the namespace keeps running).
    link = ["ip", "link", "set", "llmtv2"]
    subprocess.run([*link, "down"], check=True)
    try:
        start = time.monotonic()
        result = ssh_doctor(cluster, tmp_path, "node1 slots=1\nnode2 slots=1\n", "cluster.nproc_per_node=1",
                            "doctor.connect_timeout_s=3", timeout=60)
        took = time.monotonic() - start
    finally:
        subprocess.run([*link, "up"], check=True)
    assert result.returncode == 1 and took < 15, (took, result.stdout + result.stderr)
    lines = result.stdout.splitlines()
    assert re.fullmatch(r"node2: unreachable after [1-3]\.\d s \(ssh: connect to host node2 port 2222: "
                        r"(Connection timed out|No route to host)\)", lines[0]), lines
    assert lines[1].startswith("llmtrain doctor: 1 of 2 host(s) of ") and "node1" not in result.stdout
    assert not (tmp_path / "doctor").exists()
    assert wait_for(lambda: cluster.ssh("node2", "true", timeout=20).returncode == 0, timeout=60)


def test_doctor_under_slurm_names_a_drained_node_then_runs_on_both(cluster, tmp_path):
    def scontrol(*args: str) -> None:
        subprocess.run(["scontrol", "update", "NodeName=node2", *args], check=True, env=cluster.environ())

    args = ["doctor", "cluster=slurm", "cluster.nnodes=2", "cluster.nproc_per_node=1", "cluster.gpus_per_node=0",
            "cluster.time=null", "device=cpu", "launch.pg_timeout_s=120", f"doctor.dir={tmp_path / 'doctor'}"]
    scontrol("State=DRAIN", "Reason=doctor test: disk replaced in rack 3")  # longer than sinfo's default width
    try:
        result = run_cli(args, env=cluster.env, timeout=60)
    finally:
        scontrol("State=RESUME")
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stdout.splitlines() == [
        "node2: drained (doctor test: disk replaced in rack 3)",
        "llmtrain doctor: partition debug: 1 of 2 node(s) usable, fewer than cluster.nnodes=2: the job could not "
        "start; nothing was submitted"]
    assert not (tmp_path / "doctor").exists()
    idle = lambda: subprocess.run(["sinfo", "-h", "-o", "%T"], env=cluster.environ(), capture_output=True,  # noqa: E731
                                  text=True).stdout.split() == ["idle"]
    assert wait_for(idle, timeout=60)

    # Both nodes back: the job runs under srun, one process per node, and each node names its interface.
    result = run_cli([*args, "--max-bytes", "65536", "--iters", "2"], env=cluster.env, timeout=300)
    out = result.stdout
    assert result.returncode == 0, out[-4000:] + result.stderr[-2000:]
    assert out.startswith("llmtrain doctor: partition debug: 2 of 2 node(s) usable (node1, node2); cluster.nnodes=2\n")
    for host, address in (("node1", r"10\.200\.0\.11"), ("node2", r"10\.200\.0\.12")):
        assert re.search(rf"^│ [01] +│ {host} +│ gloo +│ eth0 +│ {address} +│ route to \S+ +│$", out, re.M), out
    assert "  intra-node: not measured (one process per node)\n" in out
    assert re.search(r"^  inter-node: \d+\.\d{3} GB/s at \d+ KiB \(1 rank on each of 2 nodes\)\n  all: the same "
                     r"ranks as inter-node$", out, re.M), out
    assert re.search(r"^all_to_all bandwidth, .*\n  intra-node: not measured \(one process per node\)\n  inter-node: "
                     r"\d+\.\d{3} GB/s at (4|64) KiB, algbw \d+\.\d{3} GB/s \(1 rank on each of 2 nodes\)\n  all: "
                     r"the same ranks as inter-node$", out, re.M), out
    [folder] = list((tmp_path / "doctor").iterdir())
    report = json.loads((folder / "report.json").read_text())
    assert report["ok"] is True
    [a2a] = [res["rows"] for s in report["all_to_all_sweeps"] for res in s.get("results", [])]
    assert [row["bytes"] for row in a2a] == [4096, 65536] and all(row["busbw_gbs"] > 0 for row in a2a)
