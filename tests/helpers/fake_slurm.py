"""Slurm without a cluster: a fake sbatch/scontrol/scancel/sinfo at subprocess.run (the `fake` fixture), a follower
monitor without sleeps, and a validated two-node Slurm config."""

from __future__ import annotations

import io
import subprocess

import pytest
from rich.console import Console

from llmtrain.launch.backends import slurm
from llmtrain.launch.config_probes import compose_here, validate_here


JOB = """JobId=123 JobName=llmtrain-gpt-tiny
   UserId=root(0) GroupId=root(0) MCS_label=N/A
   Priority=1 Nice=0 Account=(null) QOS=(null)
   JobState={state} Reason={reason} Dependency=(null)
   Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode={exit}
   RunTime=00:00:00 TimeLimit=UNLIMITED TimeMin=N/A
   Partition=debug AllocNode:Sid=head:1234
   ReqNodeList=(null) ExcNodeList=(null)
   NodeList={nodes}
   NumNodes={nnodes} NumCPUs=3 NumTasks=3 CPUs/Task=1 ReqB:S:C:T=0:0:*:*
   TRES=cpu=3,node=3,billing=3
"""
PARTITION = """PartitionName=debug
   AllowGroups=ALL AllowAccounts=ALL AllowQos=ALL
   MaxNodes={max_nodes} MaxTime=UNLIMITED MinNodes=0 LLN=NO MaxCPUsPerNode=UNLIMITED
   Nodes=node[1-2]
   State=UP TotalCPUs=4 TotalNodes={total} SelectTypeParameters=NONE
"""


def job(state="PENDING", reason="None", nnodes="2-2", exit="0:0", nodes="(null)") -> str:
    return JOB.format(state=state, reason=reason, nnodes=nnodes, exit=exit, nodes=nodes)


def partition(total=2, max_nodes="UNLIMITED") -> str:
    return PARTITION.format(total=total, max_nodes=max_nodes)


class FakeSlurm:
    """subprocess.run for sbatch/scontrol/scancel: `scontrol show job` answers from `jobs` in turn (the last one
    repeats); every call must carry a timeout."""

    def __init__(self, jobs=(job(),), part=partition(), sbatch=(0, "123\n", ""), scancel=None, sinfo=(1, "", "")):
        self.jobs, self.part, self.sbatch, self.scancel, self.sinfo = list(jobs), part, sbatch, scancel, sinfo
        self.calls: list[list[str]] = []

    def __call__(self, argv, **kwargs):
        assert kwargs.get("timeout"), f"{argv} was run without a timeout"
        self.calls.append(list(argv))
        rc, out, err = 0, "", ""
        if argv[0] == "sbatch":
            rc, out, err = self.sbatch
        elif argv[0] == "sinfo":
            rc, out, err = self.sinfo
        elif argv[:3] == ["scontrol", "show", "job"]:
            out = self.jobs.pop(0) if len(self.jobs) > 1 else self.jobs[0]
        elif argv[:3] == ["scontrol", "show", "partition"]:
            out = self.part
        elif argv[:3] == ["scontrol", "show", "hostnames"]:
            out = "node1\nnode2\n"
        elif argv[0] == "scancel" and self.scancel:
            raise self.scancel
        return subprocess.CompletedProcess(argv, rc, out, err)

    def scancels(self) -> list[list[str]]:
        return [c for c in self.calls if c[0] == "scancel"]


class FakeMonitor:
    """Monitor.follow without the sleeps: polls until an exit code; `interrupt_at` raises Ctrl-C at that poll."""

    def __init__(self, interrupt_at: int | None = None):
        self.console = Console(file=io.StringIO(), width=1000)
        self.interrupt_at = interrupt_at

    def follow(self, poll, interval_s=0.3, timeout_s=None):
        for n in range(1, 100):
            if n == self.interrupt_at:
                raise KeyboardInterrupt
            code = poll()
            if code is not None:
                return code
        raise AssertionError("the follower never returned")

    @property
    def text(self) -> str:
        return self.console.file.getvalue()


def slurm_cfg(*overrides: str):
    cfg = compose_here(["cluster=slurm", "device=cpu", "cluster.nnodes=2", "cluster.nproc_per_node=1",
                          *overrides])
    validate_here(cfg)
    return cfg


@pytest.fixture
def fake(monkeypatch):
    def install(**kwargs) -> FakeSlurm:
        f = FakeSlurm(**kwargs)
        monkeypatch.setattr(slurm.subprocess, "run", f)
        return f
    return install
