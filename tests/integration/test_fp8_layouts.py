"""precision=fp8 from the real binary (refused on a CPU before anything starts) and under several-process layouts against bf16."""

from __future__ import annotations

import json
import os

import pytest
import torch
from conftest import run_cli
from helpers.fp8_cases import H100, NEEDS, PARITY, TINY
from helpers.ranks import run_ranks

from llmtrain.config import compose_config
from llmtrain.hardware import profiles as hardware
from llmtrain.launch.config_probes import validate_here


def test_launch_refuses_fp8_on_cpu_before_anything_starts(tmp_path):
    run_dir = tmp_path / "run"
    result = run_cli(["launch", f"run.dir={run_dir}", "precision=fp8", "device=cpu"], timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr == f"llmtrain: error: {NEEDS}device=cpu trains on the CPU; use precision=bf16\n"
    assert not run_dir.exists()


def _run_rank(rank: int, world: int, overrides: list[str], run_dir: str) -> None:
    """One rank of a CPU job in a process forked from this one (helpers.ranks), on a simulated H100."""
    hardware.device_name = lambda device_type=None: H100
    hardware.device_capability = lambda: "9.0"
    hardware.device_memory_gib = lambda: 80.0
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    import torch.distributed as dist

    from llmtrain.train.trainer import Trainer

    cfg = compose_config([*TINY, f"run.dir={run_dir}", f"cluster.nproc_per_node={world}", *overrides])
    validate_here(cfg)
    dist.init_process_group("gloo", init_method=f"file://{run_dir}/pg-store", rank=rank, world_size=world)
    Trainer(cfg, run_dir, torch.device("cpu")).train()
    dist.destroy_process_group()


def spawn_run(run_dir, *overrides: str, world: int = 2) -> dict[int, float]:
    run_dir.mkdir(exist_ok=True)
    for old in run_dir.glob("pg-*"):
        old.unlink()
    run_ranks(world, _run_rank, list(overrides), str(run_dir), init_group=False)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return {r["step"]: r["loss"] for r in rows if "loss" in r}


LAYOUTS = [["parallel.zero=3", "train.micro_batch_size=2"], ["parallel.tp=2"],
           ["parallel.pp=2", "recompute=full", "train.micro_batch_size=2"]]


@pytest.mark.slow
@pytest.mark.parametrize("layout", LAYOUTS, ids=["zero3-float8-all-gather", "tp2-float8-styles", "pp2-recompute"])
def test_fp8_layouts_track_bf16_and_resume_across_precisions(layout, tmp_path):
    pytest.importorskip("torchao")
    run = [*layout, "train.max_steps=4"]
    bf16 = spawn_run(tmp_path / "bf16", *run, "precision=bf16")
    fp8 = spawn_run(tmp_path / "fp8", *run, "precision=fp8")
    assert sorted(fp8) == [1, 2, 3, 4] and bf16[4] < bf16[1]
    assert max(abs(fp8[s] - bf16[s]) / bf16[s] for s in bf16) <= PARITY
    # Saved by fp8 at step 2, resumed by bf16: the checkpoint holds plain tensors under the usual names.
    spawn_run(tmp_path / "mixed", *run, "precision=fp8", "train.stop_at_step=2")
    mixed = spawn_run(tmp_path / "mixed", *run, "precision=bf16")
    assert sorted(mixed) == [1, 2, 3, 4] and mixed[1] == fp8[1]
    assert max(abs(mixed[s] - bf16[s]) / bf16[s] for s in bf16) <= PARITY
