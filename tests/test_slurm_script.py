"""The sbatch script as Slurm reads it: CPUs per task (cluster.cpus_per_node, else the partition's CPUs per node from
sinfo), quoted #SBATCH values (a run.dir with a space), sbatch refusals that name the size keys only when they are
about sizes, and the schema's Slurm defaults. sinfo/sbatch are faked at subprocess.run."""

from __future__ import annotations

import pytest
from conftest import REPO
from test_cluster_config import fake, slurm_cfg  # noqa: F401  (fake: the fixture)

from llmtrain.cli import main
from llmtrain.config import ConfigError
from llmtrain.config.schema import ClusterConfig
from llmtrain.launch.slurm import SlurmBackend

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
    from llmtrain.launch.slurm_nodes import parse_cpus

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
