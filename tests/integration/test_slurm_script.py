"""The sbatch script as Slurm reads it: CPUs per task (cluster.cpus_per_node, else the partition's CPUs per node from
sinfo), quoted #SBATCH values (a run.dir with a space), sbatch refusals that name the size keys only when they are
about sizes, and the schema's Slurm defaults (sinfo/sbatch faked at subprocess.run). Then the script run by bash
with srun/scontrol/scancel faked: a USR1 to the batch shell passed on to the steps, a second job in a held run
directory refused, and `llmtrain status` of a requeued job that its launcher follows."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
from conftest import REPO
from helpers.fake_slurm import fake, slurm_cfg  # noqa: F401  (fake: the fixture)

from llmtrain.cli import main
from llmtrain.config import ConfigError, to_yaml
from llmtrain.config.schema import ClusterConfig
from llmtrain.launch.run_lock import RunDirLock
from llmtrain.launch.backends.slurm import SlurmBackend

# sinfo -h -o '%P|%c': the default partition marked `*`; a partition whose nodes differ has a line per kind.
SINFO = "debug*|2\ngpu|64\ngpu|48+\n"


def srun_line(script: str) -> str:
    [line] = [ln for ln in script.splitlines() if ln.startswith("srun ")]
    return line


@pytest.mark.parametrize("overrides,sinfo,cpus", [
    ((), (0, SINFO, ""), 2),                                        # the default partition's nodes
    (("cluster.partition=gpu",), (0, SINFO, ""), 48),               # the fewest of the partition's nodes
    (("cluster.cpus_per_node=6",), (0, SINFO, ""), 6),              # set: sinfo is not asked
    (("cluster.nproc_per_node=4",), (1, "", "sinfo: error: ..."), 4),  # sinfo cannot say: one per process
])
def test_each_node_task_gets_the_nodes_cpus(fake, overrides, sinfo, cpus):
    f = fake(sinfo=sinfo)
    backend = SlurmBackend(slurm_cfg(*overrides), "/tmp/r")
    script = backend.script()
    assert f"\n#SBATCH --cpus-per-task={cpus}\n" in script, script
    assert srun_line(script).startswith(f"srun --nodes=2 --ntasks-per-node=1 --cpus-per-task={cpus} ")
    asked = [c for c in f.calls if c[0] == "sinfo"]
    assert asked == ([] if "cluster.cpus_per_node=6" in overrides else
                     [["sinfo", "-h", "-o", "%P|%c", *(["-p", "gpu"] if "cluster.partition=gpu" in overrides else [])]])
    assert f"--cpus-per-task={cpus}: " in backend.preview()


def test_sinfo_cpus_are_read_per_partition():
    from llmtrain.slurm.node_states import parse_cpus

    assert parse_cpus(SINFO, None) == 2 and parse_cpus(SINFO, "gpu") == 48 and parse_cpus(SINFO, "cpu") is None
    assert parse_cpus("", None) is None


def test_slurm_defaults_live_in_the_schema():
    assert ClusterConfig().time == "04:00:00" and ClusterConfig().cpus_per_node is None
    assert "time" not in (REPO / "configs" / "cluster" / "slurm.yaml").read_text()
    assert slurm_cfg().cluster.time == "04:00:00"
    assert "\n#SBATCH --time" not in SlurmBackend(slurm_cfg("cluster.time=null"), "/tmp/r").script()


def test_a_run_dir_with_a_space_or_percent_is_quoted_for_sbatch(fake):
    fake()
    script = SlurmBackend(slurm_cfg("cluster.job_name=my job"), "/tmp/my runs/50%").script()
    assert '\n#SBATCH --output="/tmp/my runs/50%%/logs/slurm-%j.out"\n' in script, script
    assert '\n#SBATCH --job-name="my job"\n' in script
    # Everything else that holds the path is quoted for the shell.
    assert "rm -f '/tmp/my runs/50%/logs'/rank*.status" in script


def test_a_run_dir_sbatch_cannot_carry_is_refused_naming_run_dir(tmp_path, capsys):
    run_dir = tmp_path / 'say "hi"'
    code = main(["launch", "--dry-run", f"run.dir='{run_dir}'", "cluster=slurm", "device=cpu"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith("llmtrain: error: run.dir: ") and "holds a double quote or a line break" in err, err


def test_a_refusal_not_about_sizes_names_no_size_keys(tmp_path, fake):
    said = "sbatch: error: Unable to open file /nowhere/job.sbatch"
    fake(sbatch=(1, "", said + "\n"))
    backend = SlurmBackend(slurm_cfg(), str(tmp_path / "run"))
    with pytest.raises(ConfigError) as e:
        backend.submit()
    assert e.value.key == "cluster"
    assert e.value.message == f"sbatch refused the job script {tmp_path}/run/slurm/job.sbatch: {said}"
    # An #SBATCH line sbatch cannot read comes from cluster.sbatch_extra once run.dir is quoted.
    fake(sbatch=(1, "", "sbatch: error: Invalid directive found in batch script: b\n"))
    with pytest.raises(ConfigError) as e:
        SlurmBackend(slurm_cfg("cluster.sbatch_extra=['--constraint=a b']"), str(tmp_path / "run")).submit()
    assert e.value.key == "cluster.sbatch_extra" and "cluster.nnodes" not in e.value.message


# ------------------------------------------------------------------------------ the batch script, run with fakes
def _fake_bin(bin_dir: Path, name: str, body: str) -> None:
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / name).write_text("#!/bin/sh\n" + body)
    (bin_dir / name).chmod(0o755)


def _batch_script(tmp_path: Path, run_dir: Path, srun: str) -> tuple[Path, dict]:
    """The rendered script with srun, scontrol and scancel faked (each records its arguments in tmp_path)."""
    script = tmp_path / "job.sbatch"
    script.write_text(SlurmBackend(slurm_cfg(f"cluster.workdir={tmp_path}", "cluster.time=null"),
                                   str(run_dir)).script())
    bin_dir = tmp_path / "bin"
    _fake_bin(bin_dir, "srun", srun)
    _fake_bin(bin_dir, "scontrol", f'echo "$@" >> {tmp_path}/scontrol.txt\n'
                                   '[ "$2" = hostnames ] && echo node1\n'
                                   '[ "$2" = job ] && [ "$3" = 100 ] && echo "JobId=100 JobState=RUNNING"\nexit 0\n')
    _fake_bin(bin_dir, "scancel", f'echo "$@" >> {tmp_path}/scancel.txt\n'
                                  f'kill -USR1 "$(cat {tmp_path}/srun.pid)"\n')  # Slurm signals the step
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", SLURM_JOB_ID="101", SLURM_JOB_NODELIST="node1")
    return script, env


def test_a_usr1_to_the_batch_shell_is_passed_on_to_the_steps_and_requeues(tmp_path):
    """`scancel --batch --signal=USR1` (or --signal=B:USR1@N): the shell lives, the steps get USR1 (scancel
    --signal=USR1 JOB), srun's own exit status is kept, and the job's end requeues the job with the checkpoint."""
    run_dir = tmp_path / "run"
    (run_dir / "logs").mkdir(parents=True)
    (tmp_path / "status.json").write_text(json.dumps({"status": "preempted", "step": 5, "saved": True}))
    # The step: waits for USR1, then checkpoints (its rank status) and exits cleanly, as the workers do.
    srun = (f"echo $$ > {tmp_path}/srun.pid\n"
            f"trap 'cp {tmp_path}/status.json {run_dir}/logs/rank0.status; exit 0' USR1\n"
            "i=0; while [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done; exit 9\n")
    script, env = _batch_script(tmp_path, run_dir, srun)
    proc = subprocess.Popen(["bash", str(script)], cwd="/", env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 60
    while not (tmp_path / "srun.pid").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.5)
    os.kill(proc.pid, signal.SIGUSR1)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    assert (tmp_path / "scancel.txt").read_text() == "--signal=USR1 101\n", out
    assert "llmtrain: preemption notice (USR1 to the batch shell): passed on to the job's steps\n" in out
    assert ("llmtrain: a preemption notice came: checkpoint at step 5 saved; requeueing job 101 to continue\n"
            in out), out
    assert "requeue 101\n" in (tmp_path / "scontrol.txt").read_text()


def test_a_second_job_in_a_held_run_dir_refuses_before_anything_runs(tmp_path):
    """The script submitted again by hand while job 100 holds the run directory: one line, exit 1, srun never
    runs and job 100's rank statuses stay; job 100 itself (a requeued start) gets in; a free directory is taken."""
    run_dir = tmp_path / "run"
    (run_dir / "logs").mkdir(parents=True)
    (run_dir / "logs" / "rank0.status").write_text('{"status": "ok"}')
    lock = {"host": "login1", "pid": 1, "job": "100", "started": "2025-01-01 10:00:00"}
    (run_dir / ".lock").write_text(json.dumps(lock))
    script, env = _batch_script(tmp_path, run_dir, f"touch {tmp_path}/srun-ran\n")
    result = subprocess.run(["bash", str(script)], cwd="/", env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and result.stderr == "", result.stderr
    assert result.stdout == (f"llmtrain: error: run.dir: Slurm job 101 does not start: {run_dir} is in use by Slurm "
                             "job 100 (submitted from login1), since 2025-01-01 10:00:00; wait for it to end, stop "
                             f"it, or use another run.dir (remove {run_dir}/.lock only if that job is gone)\n")
    assert not (tmp_path / "srun-ran").exists() and (run_dir / "logs" / "rank0.status").exists()
    assert json.loads((run_dir / ".lock").read_text()) == lock

    result = subprocess.run(["bash", str(script)], cwd="/", env={**env, "SLURM_JOB_ID": "100"},
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and (tmp_path / "srun-ran").exists(), result.stdout + result.stderr

    (run_dir / ".lock").unlink()
    (tmp_path / "srun-ran").unlink()
    result = subprocess.run(["bash", str(script)], cwd="/", env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and (tmp_path / "srun-ran").exists(), result.stdout + result.stderr
    assert json.loads((run_dir / ".lock").read_text())["job"] == "101"


def test_a_launcher_names_its_job_in_the_lock_as_soon_as_sbatch_answers(tmp_path, fake):
    fake(sbatch=(0, "123\n", ""))
    run_dir = tmp_path / "run"
    lock = RunDirLock(str(run_dir))
    lock.acquire()
    backend = SlurmBackend(slurm_cfg("cluster.follow=true"), str(run_dir))
    backend.on_submitted = lock.name_job
    assert backend.submit() == "123"
    held = json.loads((run_dir / ".lock").read_text())
    assert held["job"] == "123" and held["pid"] == os.getpid() and lock.held
    lock.release()  # a following launcher whose job ended frees the directory
    assert not (run_dir / ".lock").exists()


def test_status_of_a_requeued_job_while_its_launcher_follows_it(tmp_path, monkeypatch, capsys):
    """A following launcher holds the lock and has named its job: while Slurm holds the requeued job, status says
    pending, with Slurm's reason and the requeue, and names the launcher."""
    run_dir = tmp_path / "run"
    (run_dir / "logs").mkdir(parents=True)
    (run_dir / "config.yaml").write_text(to_yaml(slurm_cfg(f"run.dir={run_dir}")))
    lock = RunDirLock(str(run_dir))
    lock.acquire()
    lock.name_job("4242")
    launcher = {"host": socket.gethostname(), "pid": os.getpid()}
    (run_dir / "job.json").write_text(json.dumps({"launches": [
        {"launch": 1, "backend": "slurm", "launcher": launcher, "job_id": None, "hosts": None,
         "started": "2025-01-01 10:00:00", "overrides": [], "ended": None, "exit_code": None}]}))

    def scontrol(argv, **kwargs):
        out = ("JobId=4242 JobName=llmtrain-gpt-tiny\n   JobState=PENDING Reason=BeginTime Dependency=(null)\n"
               "   Requeue=1 Restarts=1 BatchFlag=1 Reboot=0 ExitCode=0:0\n   NodeList=(null)\n")
        return subprocess.CompletedProcess(argv, 0, out, "")

    monkeypatch.setattr("llmtrain.slurm.client.subprocess.run", scontrol)
    try:
        assert main(["status", str(run_dir)]) == 0
    finally:
        lock.release()
    out = capsys.readouterr().out
    assert "\nstate       pending: Slurm job 4242 PENDING (BeginTime), requeued (restart 1)\n" in out, out
    assert f"Slurm job 4242 (PENDING), launcher pid {os.getpid()} on {socket.gethostname()}" in out, out
    assert "\nnodes       not assigned yet\n" in out, out
