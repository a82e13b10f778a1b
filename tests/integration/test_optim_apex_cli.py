"""Optimizer settings through the real binary: retired apex precisions and a missing apex are one line; a fused-apex run resumes exactly with apex or torch."""

from __future__ import annotations

import pytest
from conftest import run_cli
from helpers.apex_stand_in import ONE_PROCESS, stand_in_apex  # noqa: F401


@pytest.mark.parametrize("command", [["launch", "precision=apex-o1"], ["plan", "precision=apex-o2"]],
                         ids=["launch-o1", "plan-o2"])
def test_retired_apex_amp_precisions_are_one_line(command, tmp_path):
    name = command[1].split("=")[1]
    result = run_cli([command[0], *command[1:], f"run.dir={tmp_path / 'r'}"])
    assert result.returncode == 2
    assert result.stderr == (
        f"llmtrain: error: precision: {name} is retired: current NVIDIA apex has no amp (apex.amp was removed); "
        "precision=fp16 is the O1 recipe (autocast + dynamic loss scaling starting at 2^16) and precision=bf16 "
        "the modern default (no loss scaling needed)\n")
    assert result.stdout == "" and not (tmp_path / "r").exists()


def test_fused_apex_without_apex_says_how_to_build_it(tmp_path):
    try:
        import apex  # noqa: F401
        pytest.skip("apex is installed here")
    except ImportError:
        pass
    result = run_cli(["launch", f"run.dir={tmp_path / 'r'}", "optim.fused=apex", "cluster.nproc_per_node=1"])
    assert result.returncode == 2
    assert result.stderr == (
        "llmtrain: error: optim.fused: NVIDIA apex is not installed (it is not on PyPI); optim.fused=apex needs its "
        "CUDA extensions amp_C and fused_layer_norm_cuda: git clone https://github.com/NVIDIA/apex && cd apex && "
        "APEX_CUDA_EXT=1 pip install -v --no-build-isolation . (docs/parallelism.md, 'Fused AdamW and NVIDIA apex': a build of "
        "just these two); or use optim.fused=auto (torch's fused AdamW on CUDA, no build)\n")
    assert not (tmp_path / "r").exists()


@pytest.mark.slow
def test_fused_apex_run_resumes_exactly_with_apex_or_torch(tmp_path, stand_in_apex, monkeypatch):
    """apex's step count survives a checkpoint (it lives per param group, and is saved per parameter), so a
    stopped apex run resumes with the uninterrupted run's losses, with apex or with torch's AdamW. In-process:
    the optimizer's state is under test, not the launcher."""
    import io
    import shutil

    from conftest import train_losses
    from helpers.inprocess_run import train_in_process
    from rich.console import Console

    monkeypatch.setenv("PYTHONPATH", str(stand_in_apex()))
    args = [*ONE_PROCESS, "train.max_steps=6"]
    train_in_process(tmp_path / "plain", *args, "optim.fused=none")
    reference = train_losses(tmp_path / "plain")
    train_in_process(tmp_path / "apex", *args, "optim.fused=apex", "train.stop_at_step=3")
    log = (tmp_path / "apex" / "logs" / "rank0.log").read_text()
    assert log.count("apex stand-in: FusedLayerNorm") == 2 * 4 + 1 and log.count("apex stand-in: FusedAdam") == 1
    shutil.copytree(tmp_path / "apex", tmp_path / "apex-then-torch")
    for run_dir, fused in ((tmp_path / "apex", "apex"), (tmp_path / "apex-then-torch", "torch")):
        said = Console(record=True, width=200, file=io.StringIO())
        train_in_process(run_dir, *args, f"optim.fused={fused}", console=said)
        assert "resuming from" in said.export_text()
        losses = train_losses(run_dir)
        assert sorted(losses) == [1, 2, 3, 4, 5, 6]
        assert max(abs(losses[s] - reference[s]) for s in reference) <= 1e-6, (fused, losses, reference)
