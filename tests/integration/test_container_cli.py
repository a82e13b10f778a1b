"""A bad container setting given to the real binary: one line, and nothing submitted."""

from __future__ import annotations

import os

from conftest import run_cli
from helpers.fake_bin import _fake_bin  # noqa: F401


def test_bad_container_setting_submits_nothing(tmp_path):
    bin_dir = tmp_path / "bin"
    for tool in ("sbatch", "scontrol"):
        _fake_bin(bin_dir, tool, f"touch {tmp_path}/{tool}-ran\necho 1\n")
    result = run_cli(["launch", f"run.dir={tmp_path / 'run'}", "cluster=slurm", "cluster.nnodes=1", "device=cpu",
                      "cluster.container.runtime=pyxis", "cluster.python=python"],
                     env={"PATH": f"{bin_dir}:{os.environ['PATH']}"}, timeout=120)
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("llmtrain: error: cluster.container.image: cluster.container.runtime=pyxis "
                                    "needs an image"), result.stderr
    assert not list(tmp_path.glob("*-ran")) and not (tmp_path / "run").exists()
