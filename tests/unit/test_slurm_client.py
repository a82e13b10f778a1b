"""llmtrain.slurm: `scontrol show job` read from its text and from its --json form into the same fields, the --json
probe made once per scontrol program, and the one set of job states."""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from llmtrain.slurm import client
from llmtrain.slurm.job_states import ENDED_STATES, NOT_STARTED_STATES, exit_code
from llmtrain.slurm.show_output import parse_json, parse_text

# Captured from the two-node test cluster (Slurm 22.05.8): a job that exited 3 after a second.
FAILED_TEXT = """JobId=3 JobName=wrap
   UserId=root(0) GroupId=root(0) MCS_label=N/A
   Priority=4294901757 Nice=0 Account=(null) QOS=(null)
   JobState=FAILED Reason=NonZeroExitCode Dependency=(null)
   Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=3:0
   RunTime=00:00:01 TimeLimit=00:05:00 TimeMin=N/A
   SubmitTime=2026-12-02T16:59:40 EligibleTime=2026-12-02T16:59:40
   AccrueTime=2026-12-02T16:59:40
   StartTime=2026-12-02T16:59:41 EndTime=2026-12-02T16:59:42 Deadline=N/A
   SuspendTime=None SecsPreSuspend=0 LastSchedEval=2026-12-02T16:59:41 Scheduler=Main
   Partition=debug AllocNode:Sid=localhost:26263
   ReqNodeList=(null) ExcNodeList=(null)
   NodeList=node[1-2]
   BatchHost=node1
   NumNodes=2 NumCPUs=2 NumTasks=2 CPUs/Task=1 ReqB:S:C:T=0:0:*:*
   TRES=cpu=2,node=2,billing=2
   Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=*
   Command=(null)
   WorkDir=/tmp
   Power=
"""
# The same cluster: a job asking for more nodes than its partition has, and an unnamed job's empty NodeList.
PENDING_TEXT = """JobId=2 JobName=my job
   JobState=PENDING Reason=PartitionNodeLimit Dependency=(null)
   Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0
   StartTime=Unknown EndTime=Unknown Deadline=N/A
   Partition=debug AllocNode:Sid=localhost:26263
   NodeList=
   NumNodes=3-3 NumCPUs=3 NumTasks=3 CPUs/Task=1 ReqB:S:C:T=0:0:*:*
"""
# `scontrol --json show job` as Slurm 23.02 and later print it (data_parser v0.0.39+), cut to the fields read.
RUNNING_JSON = {"meta": {"plugin": {"type": "openapi/v0.0.40"}}, "errors": [], "warnings": [], "jobs": [{
    "job_id": 4242, "name": "llmtrain-gpt-tiny", "job_state": ["PENDING", "REQUEUED"], "state_reason": "BeginTime",
    "nodes": "", "node_count": {"set": True, "infinite": False, "number": 2}, "partition": "debug",
    "restart_cnt": 1, "end_time": {"set": True, "infinite": False, "number": 1764694782},
    "exit_code": {"status": ["SIGNALED"], "return_code": {"set": True, "infinite": False, "number": 0},
                  "signal": {"id": {"set": True, "infinite": False, "number": 9}, "name": "KILL"}}}]}
# The older form (data_parser v0.0.38): plain strings and numbers, the exit code as a wait status.
OLD_JSON = {"errors": [], "jobs": [{"job_id": 7, "name": "wrap", "job_state": "COMPLETED", "state_reason": "None",
                                    "nodes": "node1", "node_count": 1, "partition": "debug", "restart_cnt": 0,
                                    "end_time": 0, "exit_code": 3 << 8}]}


def test_text_form_is_read_key_by_key():
    fields = parse_text(FAILED_TEXT)
    assert (fields["JobState"], fields["Reason"], fields["ExitCode"], fields["NodeList"]) == \
        ("FAILED", "NonZeroExitCode", "3:0", "node[1-2]")
    assert fields["AllocNode:Sid"] == "localhost:26263" and fields["CPUs/Task"] == "1"
    assert fields["TRES"] == "cpu=2,node=2,billing=2" and fields["Power"] == ""
    assert fields["EndTime"] == "2026-12-02T16:59:42" and exit_code(fields) == 3
    pending = parse_text(PENDING_TEXT)
    assert pending["JobName"] == "my job" and pending["NodeList"] == "" and pending["NumNodes"] == "3-3"
    assert parse_text("slurm_load_jobs error: Invalid job id specified\n") == {}
    assert parse_text("A=1 A=2 word B=3")["A"] == "1"  # the first of each key; a repeat's words are dropped


def test_json_form_gives_the_text_forms_fields():
    fields, unknown = parse_json(json.dumps(RUNNING_JSON))
    assert not unknown
    assert fields["JobState"] == "REQUEUED"  # a flag is shown before the base state, as the text form does
    assert (fields["Reason"], fields["NodeList"], fields["NumNodes"], fields["Restarts"]) == \
        ("BeginTime", "(null)", "2", "1")
    assert fields["ExitCode"] == "0:9" and exit_code(fields) == 137
    assert fields["EndTime"] == time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(1764694782))
    old, _ = parse_json(json.dumps(OLD_JSON))
    assert (old["JobState"], old["ExitCode"], old["EndTime"], old["NumNodes"]) == ("COMPLETED", "3:0", "Unknown", "1")
    assert parse_json(json.dumps({"errors": [{"description": "Invalid job id specified"}], "jobs": []})) == ({}, True)
    assert parse_json(json.dumps({"errors": [{"description": "Unable to contact slurm controller"}],
                                  "jobs": []})) == ({}, False)
    assert parse_json("scontrol: unrecognized option '--json'\n") is None


class FakeScontrol:
    """subprocess.run for scontrol, with or without --json."""

    def __init__(self, json_works: bool):
        self.json_works, self.calls = json_works, []

    def __call__(self, argv, **kwargs):
        assert kwargs.get("timeout")
        self.calls.append(argv[1:])
        if "--json" in argv:
            if self.json_works:
                return subprocess.CompletedProcess(argv, 0, json.dumps(RUNNING_JSON), "")
            return subprocess.CompletedProcess(argv, 1, "", "scontrol: unrecognized option '--json'\n")
        if argv[-1] == "999":
            return subprocess.CompletedProcess(argv, 1, "", "slurm_load_jobs error: Invalid job id specified\n")
        return subprocess.CompletedProcess(argv, 0, FAILED_TEXT, "")


@pytest.mark.parametrize("json_works", [True, False])
def test_json_is_probed_once_per_scontrol(monkeypatch, tmp_path, json_works):
    (tmp_path / "scontrol").write_text("#!/bin/sh\n")
    (tmp_path / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    fake = FakeScontrol(json_works)
    monkeypatch.setattr(client.subprocess, "run", fake)
    first, second = client.show_job("5"), client.show_job("5")
    assert first == second and first.fields["JobState"] == ("REQUEUED" if json_works else "FAILED")
    if json_works:
        assert fake.calls == [["--json", "show", "job", "5"]] * 2
    else:
        assert fake.calls == [["--json", "show", "job", "5"], ["show", "job", "5"], ["show", "job", "5"]]
        assert client.show_job("999") == client.JobAnswer({}, True)


def test_a_missing_or_silent_command_is_an_answer(monkeypatch):
    def silent(argv, **kwargs):
        raise subprocess.TimeoutExpired(argv, kwargs["timeout"])

    monkeypatch.setattr(client.subprocess, "run", silent)
    assert client.show_job("5", timeout=3) is None and client.hostnames("node[1-2]") is None
    assert client.cancel("5", timeout=3) == "scancel did not answer within 3 s"
    assert client.sinfo(["-h"], timeout=2) == (None, "sinfo did not answer within 2 s")
    monkeypatch.undo()  # the real subprocess.run, and no Slurm command on PATH
    monkeypatch.setenv("PATH", "/nonexistent")
    assert client.cancel("5") == "scancel is not on PATH on this node"
    assert client.requeue("5") == "scontrol requeue did not run or answer within 60 s"


def test_one_set_of_states():
    assert {"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "CONFIGURING"} == NOT_STARTED_STATES
    assert "UNKNOWN" in ENDED_STATES and "RUNNING" not in ENDED_STATES and not NOT_STARTED_STATES & ENDED_STATES


def test_job_steps_are_the_ones_srun_started(monkeypatch):
    """squeue --steps as the two-node test cluster (Slurm 22.05.8) printed it for a job running its second srun."""
    answers = {"ok": (0, "1.1\n1.batch\n"), "refused": (1, "")}
    asked = []

    def run(argv, timeout):
        asked.append(argv)
        rc, out = answers[argv[3].split("=", 1)[1]]
        return subprocess.CompletedProcess(argv, rc, out, "")

    monkeypatch.setattr(client, "run", run)
    assert client.job_steps("ok") == ["1.1"]
    assert client.job_steps("refused") is None
    assert asked[0] == ["squeue", "--noheader", "--steps", "--jobs=ok", "--format=%i"]
