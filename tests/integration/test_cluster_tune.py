"""`llmtrain tune` on the two-node test cluster (scripts/testcluster.sh): the trials of a two-layout tune each run
as a Slurm job that the tune follows to its end and then measures, and the same tune over ssh. Skipped, with the
reason, where the cluster cannot be built."""

from __future__ import annotations

import json
import re

import pytest
from conftest import SMALL, run_cli
from helpers.cluster_nodes import ssh_args

pytestmark = [pytest.mark.slow, pytest.mark.cluster]
# One process per node, DP or PP across the two nodes; a fixed peak keeps the ranking the same in every process.
TWO_NODES = [*SMALL, "data=synthetic", "train.global_batch_size=8", "train.micro_batch_size=2", "cluster.nnodes=2",
             "cluster.nproc_per_node=1", "hardware=cpu", "+hardware.peak_tflops.float32=0.05"]
SLURM = ["cluster=slurm", "cluster.gpus_per_node=0", "cluster.time=null"]
TUNE = ["--top", "2", "--steps", "4", "--no-refine"]


def tune(cluster, tmp_path, backend: list[str]):
    tune_dir = tmp_path / "tune"
    result = run_cli(["tune", *TWO_NODES, *backend, f"run.dir={tune_dir}", *TUNE], cwd=tmp_path,
                     env={**cluster.env, "LLMTRAIN_CACHE": str(tmp_path / "cache")}, timeout=900)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-3000:]
    saved = {p.stem: json.loads(p.read_text()) for p in (tune_dir / "trials").iterdir()}
    assert len(saved) == 2, sorted(saved)
    for name, record in saved.items():
        assert record["fit"] == "ok" and record["tokens_per_s"] > 0 and record["measured_steps"] == 3, record
    best = max(saved, key=lambda name: saved[name]["tokens_per_s"])
    assert f"llmtrain: tune: fastest measured: {best} ({saved[best]['tokens_per_s']:,.0f} tokens/s" in result.stdout
    assert (tune_dir / "best" / "parallel" / "tuned.yaml").is_file()
    line = next(s for s in result.stdout.splitlines() if s.startswith("llmtrain: tune: launch it with: "))
    return tune_dir, saved, line


def test_a_tune_on_slurm_measures_each_trial_after_its_job_ends(cluster, tmp_path):
    from llmtrain.jobs.job_state import job_state

    tune_dir, saved, line = tune(cluster, tmp_path, SLURM)
    jobs = set()
    for name in saved:
        job = job_state(str(tune_dir / name)).job_id
        assert job and re.fullmatch(r"\d+", job), (name, job)
        assert (tune_dir / name / "logs" / f"slurm-{job}.out").is_file()
        jobs.add(job)
    assert len(jobs) == 2  # a job per trial
    assert " cluster=slurm " in f"{line} " and "run.dir" not in line


def test_a_tune_over_ssh_measures_both_trials(cluster, tmp_path):
    hostfile = tmp_path / "hosts.txt"
    hostfile.write_text("node1 slots=1\nnode2 slots=1\n")
    _, _, line = tune(cluster, tmp_path, ssh_args(cluster, hostfile))
    assert f" cluster=ssh cluster.hostfile={hostfile} " in line
