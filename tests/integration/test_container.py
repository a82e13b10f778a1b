"""cluster.container: the srun line with pyxis's options, the command wrapped in `apptainer exec` under Slurm and
over ssh, where cluster.setup lines run and which environment wins, and each bad setting as a one-line error.

Neither runtime is installed here: the rendered commands are checked exactly and run against stand-ins for srun
and apptainer that behave as the runtimes do (the image's variables win over the host's). A real apptainer run
needs apptainer on PATH and an image in LLMTRAIN_TEST_APPTAINER_IMAGE.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.fake_bin import _fake_bin  # noqa: F401

from llmtrain.cli import main
from llmtrain.config import ConfigError
from llmtrain.launch.backends.slurm import SlurmBackend
from llmtrain.launch.backends.ssh import SSHBackend
from llmtrain.launch.config_probes import compose_here, validate_here


PYXIS_IMAGE = "nvcr.io#nvidia/pytorch:24.05-py3"
SIF = "/shared/images/pytorch.sif"
SETUP_SCRIPT = ("eval 'export A=1' </dev/null || { echo 'llmtrain: node set-up failed: cluster.setup line 1 "
                "(export A=1) exited with status' $? >&2; exit 1; }; exec \"$@\"")


def cfg_of(*overrides: str):
    cfg = compose_here(list(overrides))
    validate_here(cfg)
    return cfg


def slurm(*overrides: str):
    return cfg_of("cluster=slurm", "cluster.nnodes=2", "cluster.nproc_per_node=1", "cluster.python=python",
                  "cluster.workdir=/shared/proj", "data=synthetic", *overrides)


def srun_line(script: str) -> str:
    [line] = [ln for ln in script.splitlines() if ln.startswith("srun ")]
    return line


def batch_shell_pythons(script: str) -> set[str]:
    """The interpreters that start the batch shell's own helpers (job start, combined log, notice, hang watch,
    job end): every one of them runs on the host, outside any container."""
    helpers = ("slurm_job_start", "combined_log", "slurm_notice", "slurm_hang_watch", "slurm_job_end")
    found = {h: re.findall(rf"(\S+) -m llmtrain\.launch\.\w+\.{h} ", script) for h in helpers}
    assert all(found.values()), found
    return {shlex.split(p)[0] for pythons in found.values() for p in pythons}


def exported(script: str) -> str:
    """The batch script's exports as `env` arguments: what the command inside the container must get too."""
    return " ".join(ln[len("export "):] for ln in script.splitlines() if ln.startswith("export "))


def plain_command(cfg, run_dir: str) -> str:
    """The srun line's command without a container (the same config, runtime none)."""
    runtime = cfg.cluster.container.runtime
    cfg.cluster.container.runtime = "none"
    try:
        return srun_line(SlurmBackend(cfg, run_dir).script()).split("--kill-on-bad-exit=1 ", 1)[1]
    finally:
        cfg.cluster.container.runtime = runtime


# ------------------------------------------------------------------------------------------------ pyxis (Slurm)
def test_pyxis_srun_line_gets_image_mounts_and_workdir():
    cfg = slurm("device=cpu", "cluster.container.runtime=pyxis", f"cluster.container.image=\"{PYXIS_IMAGE}\"",
                "cluster.container.mounts=[/data:/data:ro+rprivate]")
    script = SlurmBackend(cfg, "/shared/proj/runs/c").script()
    plain = plain_command(cfg, "/shared/proj/runs/c")
    assert plain.startswith("python -m llmtrain.launch.node.agent /shared/proj/runs/c slurm -- python -m "
                            "torch.distributed.run --nnodes=2 ")
    # The run directory lies inside the working directory: one mount holds both.
    assert srun_line(script) == (
        "srun --nodes=2 --ntasks-per-node=1 --cpus-per-task=1 --kill-on-bad-exit=1 '--container-image=nvcr.io#nvidia/pytorch:24.05-py3' "
        "--container-mounts=/shared/proj:/shared/proj,/data:/data:ro+rprivate --container-workdir=/shared/proj "
        f"env {exported(script)} {plain}")
    assert "env LLMTRAIN_AGENT_WATCH_STDIN=0 PYTHONPATH=" in srun_line(script)


def test_pyxis_mount_covering_the_workdir_and_container_workdir_and_extra_args():
    cfg = slurm("device=cpu", "cluster.container.runtime=pyxis", "cluster.container.image=/images/pt.sqsh",
                "cluster.container.mounts=[/shared:/shared]", "cluster.container.workdir=/shared/proj/src",
                "cluster.container.extra_args=[--no-container-mount-home]")
    script = SlurmBackend(cfg, "/scratch/runs/c").script()
    assert srun_line(script) == (
        "srun --nodes=2 --ntasks-per-node=1 --cpus-per-task=1 --kill-on-bad-exit=1 --container-image=/images/pt.sqsh "
        "--container-mounts=/scratch/runs/c:/scratch/runs/c,/shared:/shared --container-workdir=/shared/proj/src "
        f"--no-container-mount-home env {exported(script)} {plain_command(cfg, '/scratch/runs/c')}")


def test_the_data_files_folder_is_mounted_where_the_launcher_prepared_it():
    cfg = slurm("device=cpu", "data=stdlib", "data.path=/shared/cache/stdlib-bytes.bin",
                "cluster.container.runtime=pyxis", "cluster.container.image=/images/pt.sqsh")
    assert " --container-mounts=/shared/proj:/shared/proj,/shared/cache:/shared/cache --container-workdir=" \
        in srun_line(SlurmBackend(cfg, "/shared/proj/runs/c").script())
    inside = slurm("device=cpu", "data=stdlib", "data.path=/shared/proj/cache/stdlib-bytes.bin",
                   "cluster.container.runtime=pyxis", "cluster.container.image=/images/pt.sqsh")
    assert " --container-mounts=/shared/proj:/shared/proj --container-workdir=" \
        in srun_line(SlurmBackend(inside, "/shared/proj/runs/c").script())


def test_pyxis_setup_lines_run_inside_not_in_the_batch_shell():
    cfg = slurm("device=cpu", "cluster.container.runtime=pyxis", "cluster.container.image=/images/pt.sqsh",
                "cluster.setup=['export A=1']")
    script = SlurmBackend(cfg, "/shared/proj/runs/c").script()
    assert "eval" not in script.split("\nsrun ")[0]
    assert srun_line(script) == (
        "srun --nodes=2 --ntasks-per-node=1 --cpus-per-task=1 --kill-on-bad-exit=1 --container-image=/images/pt.sqsh "
        "--container-mounts=/shared/proj:/shared/proj --container-workdir=/shared/proj "
        f"sh -c {shlex.quote(SETUP_SCRIPT)} llmtrain-setup env {exported(script)} "
        f"{plain_command(cfg, '/shared/proj/runs/c')}")
    # Outside the container (the batch shell's helpers and its end), the launcher's own interpreter: python is the
    # image's.
    assert batch_shell_pythons(script) == {sys.executable}, script
    assert re.search(r'\nLLMTRAIN_HANG_WATCH="\$hung" exec /\S*python\S* -m llmtrain.launch.node.slurm_job_end ',
                     script), script


def _fake_python(tmp_path: Path) -> Path:
    """Stands in for the image's python: records where it runs, what it got and its arguments."""
    return _fake_bin(tmp_path / "image", "python", f'printf "%s\\n" "$INSIDE" "$NCCL_DEBUG" "$SETUP_SAW" "$PWD" "$@" '
                                                   f'> {tmp_path}/agent.txt\n')


# How both runtimes treat the environment: the host's passes in, but a variable the image sets keeps its value.
IMAGE_ENV = "export INSIDE=yes NCCL_DEBUG=from-image\n"
SETUP = ['export SETUP_SAW="inside=$INSIDE"', 'echo "setup inside=$INSIDE" >> order.txt',
         "export NCCL_DEBUG=from-setup"]


def test_pyxis_job_runs_setup_in_the_image_and_the_config_env_wins(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    cfg = cfg_of("cluster=slurm", "cluster.nnodes=1", "cluster.nproc_per_node=1", "device=cpu",
                 f"cluster.workdir={work}", f"cluster.python={_fake_python(tmp_path)}", "+env.NCCL_DEBUG=WARN",
                 "cluster.container.runtime=pyxis", "cluster.container.image=/images/pt.sqsh")
    cfg.cluster.setup = SETUP
    script = tmp_path / "job.sbatch"
    script.write_text(SlurmBackend(cfg, str(tmp_path / "run")).script())
    bin_dir = tmp_path / "bin"
    _fake_bin(bin_dir, "scontrol", "echo node1\n")
    # srun with pyxis: the --container-* options start the task in the image, in --container-workdir.
    _fake_bin(bin_dir, "srun", f'printf "%s\\n" "$@" > {tmp_path}/srun.txt\n'
                               'while [ "${1#--}" != "$1" ]; do\n'
                               '  case "$1" in --container-workdir=*) cd "${1#--container-workdir=}";; esac; shift\n'
                               f"done\n{IMAGE_ENV}exec \"$@\"\n")
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", SLURM_JOB_ID="123", SLURM_JOB_NODELIST="node1")
    result = subprocess.run(["bash", str(script)], cwd="/", env=env, capture_output=True, text=True, timeout=60)
    srun = (tmp_path / "srun.txt").read_text().splitlines()
    assert "--container-image=/images/pt.sqsh" in srun and f"--container-workdir={work}" in srun, srun
    assert (work / "order.txt").read_text() == "setup inside=yes\n", result.stderr
    agent = (tmp_path / "agent.txt").read_text().splitlines()
    assert agent[:4] == ["yes", "WARN", "inside=yes", str(work)]
    assert agent[4:7] == ["-m", "llmtrain.launch.node.agent", str(tmp_path / "run")]
    assert "--rdzv-endpoint=node1:20123" in agent


# ------------------------------------------------------------------------------------------------ apptainer
def test_apptainer_under_slurm_wraps_the_srun_command():
    cfg = slurm("device=auto", "cluster.container.runtime=apptainer", f"cluster.container.image={SIF}",
                "cluster.container.mounts=[/data:/data]", "cluster.container.workdir=/workspace",
                "cluster.container.extra_args=[--writable-tmpfs]",
                "cluster.container.executable=/opt/apptainer/bin/apptainer")
    script = SlurmBackend(cfg, "/scratch/runs/c").script()
    # The run directory lies outside the working directory: mounted on its own.
    assert srun_line(script) == (
        "srun --nodes=2 --ntasks-per-node=1 --cpus-per-task=1 --kill-on-bad-exit=1 /opt/apptainer/bin/apptainer exec --nv --bind "
        "/shared/proj:/shared/proj,/scratch/runs/c:/scratch/runs/c,/data:/data --pwd /workspace --writable-tmpfs "
        f"{SIF} env {exported(script)} {plain_command(cfg, '/scratch/runs/c')}")
    # No GPU job, no --nv.
    cpu = slurm("device=cpu", "cluster.container.runtime=apptainer", f"cluster.container.image={SIF}")
    assert f"kill-on-bad-exit=1 apptainer exec --bind /shared/proj:/shared/proj --pwd /shared/proj {SIF} env " \
        in srun_line(SlurmBackend(cpu, "/shared/proj/runs/c").script())


def ssh_backend(tmp_path: Path, *overrides: str) -> SSHBackend:
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("node1 slots=1\nnode2 slots=1\n")
    cfg = cfg_of("cluster=ssh", f"cluster.hostfile={hosts}", "cluster.master_port=29111", "data=synthetic", *overrides)
    return SSHBackend(cfg, str(tmp_path / "run"))


def test_apptainer_over_ssh_wraps_the_remote_command(tmp_path):
    backend = ssh_backend(tmp_path, "device=cpu", "cluster.workdir=/shared/proj", "cluster.python=python3",
                          "cluster.container.runtime=apptainer", f"cluster.container.image={SIF}",
                          "cluster.setup=['export A=1']")
    backend.cfg.cluster.container.runtime = "none"
    plain = backend.node_commands()[1]
    backend.cfg.cluster.container.runtime = "apptainer"
    cmd = backend.node_commands()[1]
    assert plain.argv[:4] == ["python3", "-m", "llmtrain.launch.node.agent", str(tmp_path / "run")]
    env = [f"{k}={v}" for k, v in sorted(cmd.env.items())]
    assert cmd.argv == ["apptainer", "exec", "--bind", f"/shared/proj:/shared/proj,{tmp_path}/run:{tmp_path}/run",
                        "--pwd", "/shared/proj", SIF, "sh", "-c", SETUP_SCRIPT, "llmtrain-setup", "env", *env,
                        *plain.argv]
    argv = backend.ssh_argv(cmd)
    assert argv[-2] == "node2"
    # The set-up lines run in the container only: the host shell just changes directory and starts apptainer.
    assert argv[-1] == f"cd /shared/proj && exec {shlex.join(['env', *env, *cmd.argv])}"


def test_apptainer_over_ssh_runs_setup_in_the_image_and_the_config_env_wins(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    apptainer = _fake_bin(tmp_path / "bin", "apptainer",
                          f'printf "%s\\n" "$@" > {tmp_path}/apptainer.txt\n'
                          f'while [ "$1" != {SIF} ]; do [ "$1" = --pwd ] && cd "$2"; shift; done; shift\n'
                          f"{IMAGE_ENV}exec \"$@\"\n")
    backend = ssh_backend(tmp_path, "device=cpu", f"cluster.workdir={work}", f"cluster.python={_fake_python(tmp_path)}",
                          "+env.NCCL_DEBUG=WARN", "cluster.container.runtime=apptainer",
                          f"cluster.container.image={SIF}", f"cluster.container.executable={apptainer}")
    backend.cfg.cluster.setup = SETUP
    remote = backend.ssh_argv(backend.node_commands()[0])[-1]
    result = subprocess.run(["sh", "-c", remote], cwd="/", input="", capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "apptainer.txt").read_text().splitlines()[:3] == ["exec", "--bind", f"{work}:{work},"
                                                                          f"{tmp_path}/run:{tmp_path}/run"]
    assert (work / "order.txt").read_text() == "setup inside=yes\n"
    agent = (tmp_path / "agent.txt").read_text().splitlines()
    assert agent[:4] == ["yes", "WARN", "inside=yes", str(work)]
    assert agent[4:6] == ["-m", "llmtrain.launch.node.agent"]


def test_a_failing_setup_line_inside_the_container_stops_the_node_naming_it(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    apptainer = _fake_bin(tmp_path / "bin", "apptainer", f'while [ "$1" != {SIF} ]; do shift; done; shift\n'
                                                         'exec "$@"\n')
    backend = ssh_backend(tmp_path, "device=cpu", f"cluster.workdir={work}", f"cluster.python={_fake_python(tmp_path)}",
                          "cluster.container.runtime=apptainer", f"cluster.container.image={SIF}",
                          f"cluster.container.executable={apptainer}", "cluster.setup=['true','false']")
    remote = backend.ssh_argv(backend.node_commands()[0])[-1]
    result = subprocess.run(["sh", "-c", remote], cwd="/", capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert result.stderr.strip() == "llmtrain: node set-up failed: cluster.setup line 2 (false) exited with status 1"
    assert not (tmp_path / "agent.txt").exists()


@pytest.mark.skipif(not os.environ.get("LLMTRAIN_TEST_APPTAINER_IMAGE"),
                    reason="LLMTRAIN_TEST_APPTAINER_IMAGE (an image with /bin/sh) not set")
@pytest.mark.skipif(shutil.which("apptainer") is None, reason="apptainer not installed")
def test_real_apptainer_runs_setup_inside_with_the_config_env(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    backend = ssh_backend(tmp_path, "device=cpu", f"cluster.workdir={work}", f"cluster.python={_fake_python(tmp_path)}",
                          "+env.NCCL_DEBUG=WARN", "cluster.container.runtime=apptainer",
                          f"cluster.container.image={os.environ['LLMTRAIN_TEST_APPTAINER_IMAGE']}",
                          f"cluster.container.mounts=[{tmp_path}:{tmp_path}]")
    backend.cfg.cluster.setup = ["export INSIDE=yes", *SETUP]
    remote = backend.ssh_argv(backend.node_commands()[0])[-1]
    result = subprocess.run(["sh", "-c", remote], cwd="/", input="", capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert (work / "order.txt").read_text() == "setup inside=yes\n"
    assert (tmp_path / "agent.txt").read_text().splitlines()[:4] == ["yes", "WARN", "inside=yes", str(work)]


# ------------------------------------------------------------------------------------------------ --dry-run
def test_dry_run_shows_the_container_commands(tmp_path, capsys):
    pyxis = ["cluster=slurm", "cluster.nnodes=1", "cluster.python=python", "data=synthetic",
             "cluster.container.runtime=pyxis", "cluster.container.image=/images/pt.sqsh",
             "cluster.container.mounts=[/data:/data:ro]"]
    assert main(["launch", "--dry-run", f"run.dir={tmp_path / 'run'}", f"cluster.workdir={tmp_path}", *pyxis]) == 0
    out = capsys.readouterr().out
    assert (f"\nsrun --nodes=1 --ntasks-per-node=1 --cpus-per-task=8 --kill-on-bad-exit=1 "
            f"--container-image=/images/pt.sqsh --container-mounts={tmp_path}:{tmp_path},/data:/data:ro --container-workdir={tmp_path} env ") in out
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("node1 slots=1\n")
    apptainer = ["cluster=ssh", f"cluster.hostfile={hosts}", "cluster.nnodes=1", "cluster.python=python", "device=cpu",
                 "data=synthetic",
                 "cluster.container.runtime=apptainer", f"cluster.container.image={SIF}"]
    assert main(["launch", "--dry-run", f"run.dir={tmp_path / 'run'}", f"cluster.workdir={tmp_path}", *apptainer]) == 0
    out = capsys.readouterr().out
    assert f" apptainer exec --bind {tmp_path}:{tmp_path} --pwd {tmp_path} {SIF} env " in out
    assert not (tmp_path / "run").exists()


def test_a_container_without_cluster_python_runs_the_images_python(tmp_path, capsys):
    """cluster.python unset: the image's `python` runs the node agent, torchrun and the workers in the container;
    the end of the batch script keeps the launcher's own interpreter outside it; the dry run says so."""
    image = ["cluster=slurm", "cluster.nnodes=1", "cluster.nproc_per_node=1", "data=synthetic",
             "cluster.container.runtime=pyxis", "cluster.container.image=/images/pt.sqsh"]
    script = SlurmBackend(cfg_of(*image, "cluster.workdir=/shared/proj"), "/shared/proj/runs/c").script()
    inside = srun_line(script).split(" env ", 1)[1]
    assert (" python -m llmtrain.launch.node.agent /shared/proj/runs/c slurm -- python -m torch.distributed.run "
            in inside), inside
    assert (f'\nLLMTRAIN_HANG_WATCH="$hung" exec {shlex.quote(sys.executable)} -m llmtrain.launch.node.slurm_job_end '
            in script), script
    assert batch_shell_pythons(script) == {sys.executable}, script
    ssh = ssh_backend(tmp_path, "device=cpu", "cluster.workdir=/shared/proj", "cluster.container.runtime=apptainer",
                      f"cluster.container.image={SIF}")
    argv = ssh.node_commands()[0].argv
    assert [argv[i - 1:i + 2] for i, a in enumerate(argv) if a == "-m"][:2] == [
        ["python", "-m", "llmtrain.launch.node.agent"], ["python", "-m", "torch.distributed.run"]], argv
    assert main(["launch", "--dry-run", f"run.dir={tmp_path / 'run'}", f"cluster.workdir={tmp_path}", *image]) == 0
    out = capsys.readouterr().out
    assert ("llmtrain: cluster.python is not set: each node runs the image's python (found on its PATH); set "
            "cluster.python to run another interpreter in the image\n") in out, out
    assert main(["launch", "--dry-run", f"run.dir={tmp_path / 'run'}", f"cluster.workdir={tmp_path}", *image,
                 "cluster.python=/opt/py/bin/python3"]) == 0
    assert "cluster.python is not set" not in capsys.readouterr().out


# ------------------------------------------------------------------------------------------------ bad settings
BAD = [
    (["cluster=slurm", "cluster.container.runtime=docker"], "cluster.container.runtime",
     "must be one of none, pyxis, apptainer (got docker)"),
    (["cluster.container.runtime=pyxis"], "cluster.container.runtime",
     "pyxis works with cluster=slurm, not cluster=local"),
    (["cluster.container.runtime=apptainer"], "cluster.container.runtime",
     "apptainer works with cluster=slurm or cluster=ssh, not cluster=local"),
    (["cluster=ssh", "cluster.container.runtime=pyxis"], "cluster.container.runtime",
     "pyxis works with cluster=slurm, not cluster=ssh"),
    (["cluster=slurm", "cluster.container.runtime=pyxis"], "cluster.container.image",
     "cluster.container.runtime=pyxis needs an image: an enroot URI"),
    (["cluster=slurm", "cluster.container.runtime=pyxis", "cluster.container.image=images/pt.sqsh"],
     "cluster.container.image", "a squashfs image must be an absolute path (got images/pt.sqsh)"),
    (["cluster=slurm", "cluster.container.image=/i.sif"], "cluster.container.image",
     "is set (/i.sif) but cluster.container.runtime is none"),
    (["cluster=slurm", "cluster.container.runtime=apptainer", "cluster.container.image=/i.sif",
      "cluster.container.mounts=[/data]"], "cluster.container.mounts", "entry 1 (/data) must be SRC:DST"),
    (["cluster=slurm", "cluster.container.runtime=apptainer", "cluster.container.image=/i.sif",
      "cluster.container.mounts=[/a:/a,data:/data]"], "cluster.container.mounts", "entry 2 (data:/data) must be"),
    (["cluster=slurm", "cluster.container.runtime=apptainer", "cluster.container.image=/i.sif",
      "cluster.container.workdir=work"], "cluster.container.workdir", "must be an absolute path (got work)"),
]


@pytest.mark.parametrize("overrides,key,words", BAD)
def test_bad_container_settings_are_one_line_naming_the_key(tmp_path, capsys, overrides, key, words):
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("node1 slots=1\n")
    ssh = [f"cluster.hostfile={hosts}", "cluster.nnodes=1"] if "cluster=ssh" in overrides else []
    remote = any(o in overrides for o in ("cluster=slurm", "cluster=ssh"))
    python = ["cluster.python=python"] if remote and key != "cluster.python" else []
    code = main(["launch", "--dry-run", "cluster.nproc_per_node=1", *overrides, *ssh, *python])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith(f"llmtrain: error: {key}: "), err
    assert words in err, err


def test_check_runs_with_validate():
    with pytest.raises(ConfigError) as e:
        cfg_of("cluster=slurm", "cluster.container.runtime=apptainer", "cluster.container.image=/i.sif",
               "cluster.python=python", "cluster.container.executable=''")
    assert e.value.key == "cluster.container.executable"
