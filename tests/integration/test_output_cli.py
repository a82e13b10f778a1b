"""Output of the real binary to a file or a narrow terminal: plans and deep checkpoint paths are not cut."""

from __future__ import annotations

import json

from conftest import run_cli


STAGE_COLUMNS = ["stage", "layers", "params", "params/rank", "weights", "grads", "optimizer", "gathered",
                 "activations", "in flight", "rank peak"]


def test_plan_to_a_file_is_not_cut():
    result = run_cli(["plan", "model=gpt-1.3b", "parallel.tp=2", "parallel.pp=2", "precision=bf16",
                      "cluster.nproc_per_node=8", "hardware=h100"], timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "…" not in result.stdout
    header = [line for line in result.stdout.splitlines() if line.startswith("┃")]
    assert len(header) == 1, result.stdout
    assert [cell.strip() for cell in header[0].strip("┃").split("┃")] == STAGE_COLUMNS


def test_ckpt_list_prints_a_deep_checkpoint_path_whole(tmp_path):
    run_dir = tmp_path / "runs" / ("a-rather-long-experiment-name-" * 3) / "seed-0000"
    ckpt = run_dir / "checkpoints" / "step-0000002"
    ckpt.mkdir(parents=True)
    (ckpt / "meta.json").write_text(json.dumps({"step": 2, "files": {},
                                                "layout": {"dp": 1, "tp": 1, "pp": 1, "zero": 0, "world_size": 1}}))
    assert len(str(ckpt)) > 100
    result = run_cli(["ckpt", "list", str(run_dir)], timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "…" not in result.stdout
    assert any(str(ckpt) in line for line in result.stdout.splitlines()), result.stdout
