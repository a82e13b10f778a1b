"""`llmtrain ckpt` as a command: its exit status; checkpoints of dp=2 and tp=2 runs (two processes each) verified and compared."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from helpers.ckpt_runs import TINY, cli, full_state, run, shard, train  # noqa: F401  (run: the fixture)
from torch.distributed.checkpoint import FileSystemReader


def test_the_command_exits_with_the_status_it_reports(run, tmp_path):
    from conftest import run_cli

    result = run_cli(["ckpt", "diff", "--model-only", str(run / "checkpoints" / "step-0000002"), str(run)])
    assert result.returncode == 1 and result.stdout.splitlines()[-1].startswith("different: ")
    bad = Path(shutil.copytree(run / "checkpoints" / "step-0000004", tmp_path / "step-0000004"))
    shard(bad).write_bytes(shard(bad).read_bytes()[:-1])
    result = run_cli(["ckpt", "verify", str(bad)])
    assert result.returncode == 1 and "step-0000004/__0_0.distcp: " in result.stderr and result.stdout == ""


def _train_rank(rank: int, world: int, run_dir: str, overrides: list[str]) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    train(Path(run_dir), rank, world, tuple(overrides))


@pytest.mark.slow
def test_dp2_and_tp2_checkpoints_verify_and_compare_across_layouts(run, tmp_path, capsys):
    import torch.multiprocessing as mp

    runs = {}
    for name, layout in {"dp2": ["parallel.zero=3", "train.micro_batch_size=2"], "tp2": ["parallel.tp=2"]}.items():
        runs[name] = tmp_path / name
        runs[name].mkdir()
        mp.spawn(_train_rank, args=(2, str(runs[name]), layout), nprocs=2)
        code, out, err = cli(capsys, "verify", str(runs[name]))
        assert code == 0, err
        assert f"layout dp={2 if name == 'dp2' else 1} tp={2 if name == 'tp2' else 1} pp=1" in out
    tp_chunks = FileSystemReader(str(runs["tp2"] / "checkpoints" / "step-0000004")).read_metadata()
    assert len(tp_chunks.state_dict_metadata["model.layers.0.attn.q.weight"].chunks) == 2  # really resharded
    compared = len(full_state(run / "checkpoints" / "step-0000004"))
    # Same training, other reduction orders: equal within float32 rounding, except where AdamW turns a gradient
    # that is all rounding into lr-sized steps (attn.k.bias, which softmax ignores: 1.9e-5 apart, measured).
    for a, b in ((runs["dp2"], runs["tp2"]), (runs["tp2"], run)):
        code, out, _ = cli(capsys, "diff", "--atol", "1e-4", str(a), str(b))
        assert code == 0, out
        assert out.splitlines()[-1] == f"identical: {compared} tensors compared, 0 differ, 0 only in A, " \
                                       "0 only in B (atol 0.0001)"
