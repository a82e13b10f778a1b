"""Hybrid parallelism: every layout trains the same model as one process (fp32, CPU + gloo).

Each layout runs 10 steps on the embedded stdlib data and must match the 1-process losses and gradient norms to
1e-5. The layouts compute the loss over chunks (train.loss's default) and the one process with the whole logits
(train.loss=full), so every layout also checks the chunked loss against the full one. The layouts train in ranks forked from the test process (helpers.inprocess_run: the real run directory and
worker, without torchrun's start-up; tests/integration/test_launch.py checks DP parity through `llmtrain launch`).
Sharding is checked in bytes, and tensor parallel's communication is counted.
"""

from __future__ import annotations

import json

import pytest
from conftest import SMALL
from helpers import tp_collectives
from helpers.inprocess_run import train_in_process as train
from helpers.parity import assert_parity, by_step
from helpers.ranks import run_ranks

pytestmark = pytest.mark.slow
# Evaluation on at steps 5 and 10: every layout and pipeline schedule evaluates, and its val_loss is compared too.
PARITY = SMALL + ["train.max_steps=10", "train.global_batch_size=8", "train.micro_batch_size=2",
                  "train.eval_interval=5", "train.eval_steps=1"]

LAYOUTS = {
    # name: (processes, overrides)
    "tp2": (2, ["parallel.tp=2"]),
    "tp2_sp": (2, ["parallel.tp=2", "parallel.sequence_parallel=true"]),
    "pp2_gpipe": (2, ["parallel.pp=2", "parallel.pp_schedule=gpipe"]),
    "pp2_1f1b": (2, ["parallel.pp=2", "parallel.pp_schedule=1f1b"]),
    "pp2_uneven_1f1b": (2, ["parallel.pp=2", "parallel.pp_layers=[1,3]"]),
    "pp2_v2_interleaved_1f1b": (2, ["parallel.pp=2", "parallel.pp_schedule=interleaved_1f1b",
                                    "parallel.virtual_stages=2"]),
    "pp2_v2_looped_bfs": (2, ["parallel.pp=2", "parallel.pp_schedule=looped_bfs", "parallel.virtual_stages=2"]),
    "pp2_v2_zero_bubble": (2, ["parallel.pp=2", "parallel.pp_schedule=zero_bubble", "parallel.virtual_stages=2"]),
    "pp2_v2_zbv": (2, ["parallel.pp=2", "parallel.pp_schedule=zbv", "parallel.virtual_stages=2"]),
    "pp2_v2_dualpipe_v": (2, ["parallel.pp=2", "parallel.pp_schedule=dualpipe_v", "parallel.virtual_stages=2"]),
    "dp2_zero2": (2, ["parallel.zero=2"]),
    "dp2_zero3": (2, ["parallel.zero=3"]),
    "dp4_hybrid_shard2_zero3": (4, ["parallel.zero=3", "parallel.dp_shard=2"]),
    "dp2_tp2_zero3": (4, ["parallel.tp=2", "parallel.zero=3"]),
    "pp2_tp2_sp": (4, ["parallel.pp=2", "parallel.tp=2", "parallel.sequence_parallel=true"]),
}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("ref") / "run"
    return by_step(train(run_dir, *PARITY, "cluster.nproc_per_node=1", "train.loss=full"))


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_layout_matches_one_process(name, reference, tmp_path):
    nproc, overrides = LAYOUTS[name]
    rows = train(tmp_path / name, *PARITY, f"cluster.nproc_per_node={nproc}", *overrides)
    assert_parity(rows, reference, name)


def test_3d_dp2_pp2_tp2_on_8_ranks(reference, tmp_path):
    """The full 3-D layout on the embedded default data, interleaved schedule, sequence parallel."""
    run_dir = tmp_path / "3d"
    rows = train(run_dir, *PARITY, "cluster.nproc_per_node=8", "parallel.tp=2", "parallel.pp=2",
                 "parallel.sequence_parallel=true", "train.global_batch_size=8", "train.micro_batch_size=1",
                 "parallel.pp_schedule=interleaved_1f1b", "parallel.virtual_stages=2")
    assert_parity(rows, reference, "dp2 x pp2 x tp2")
    statuses = [json.loads((run_dir / "logs" / f"rank{r}.status").read_text()) for r in range(8)]
    assert all(s["status"] == "ok" for s in statuses)


def _state_bytes(run_dir, ranks):
    return [json.loads((run_dir / "logs" / f"rank{r}.status").read_text())["state_bytes"] for r in range(ranks)]


@pytest.fixture(scope="module")
def one_step(tmp_path_factory):
    """One step on one process: the unsharded state the sharding tests divide."""
    run_dir = tmp_path_factory.mktemp("one-step") / "run"
    train(run_dir, *SMALL, "train.max_steps=1", "cluster.nproc_per_node=1")
    return _state_bytes(run_dir, 1)[0]


def test_zero3_shards_params_grads_and_optimizer_state(reference, one_step, tmp_path):
    one = one_step
    n = 4
    run_dir = tmp_path / "zero3"
    train(run_dir, *SMALL, "train.max_steps=1", f"cluster.nproc_per_node={n}", "parallel.zero=3",
           "train.micro_batch_size=2")
    for rank, b in enumerate(_state_bytes(run_dir, n)):
        for kind in ("params", "grads", "optimizer"):
            assert b[kind] <= 1.1 * one[kind] / n, f"rank {rank} {kind}: {b[kind]} > 1.1 x {one[kind]} / {n}"
    # zero=0 keeps everything on every rank
    run_dir = tmp_path / "zero0"
    train(run_dir, *SMALL, "train.max_steps=1", "cluster.nproc_per_node=2", "parallel.zero=0")
    assert all(b["params"] == one["params"] and b["optimizer"] == one["optimizer"] for b in _state_bytes(run_dir, 2))


def test_tp_splits_block_matrices(one_step, tmp_path):
    tp_dir = tmp_path / "tp4"
    train(tp_dir, *SMALL, "train.max_steps=1", "cluster.nproc_per_node=4", "parallel.tp=4")
    full = one_step["block_matrix_params"]
    assert [b["block_matrix_params"] for b in _state_bytes(tp_dir, 4)] == [full // 4] * 4


def test_tensor_parallel_issues_the_megatron_minimum_per_layer():
    # Counted on 2 forked ranks: no launcher behaviour is under test.
    counts, other = run_ranks(2, tp_collectives.per_layer)
    assert counts == other  # both ranks of the TP group issue the same collectives
    for prefix in ("", "llama_"):  # Llama's GQA k/v, SwiGLU gate and RMSNorms add no collective
        # TP without sequence parallel: one all-reduce after attention and one after the MLP, each way.
        assert counts[prefix + "tp"]["per_layer"]["forward"] == {"all_reduce": 2.0}, prefix
        assert counts[prefix + "tp"]["per_layer"]["backward"] == {"all_reduce": 2.0}, prefix
        # Sequence parallel replaces each all-reduce by an all-gather + reduce-scatter pair.
        sp = {phase: {k: v for k, v in ops.items() if v} for phase, ops in counts[prefix + "sp"]["per_layer"].items()}
        assert sp["forward"] == {"all_gather_single": 2.0, "reduce_scatter_single": 2.0}, prefix
        assert sp["backward"] == {"all_gather_single": 2.0, "reduce_scatter_single": 2.0}, prefix


def test_pipeline_evaluation_matches_one_process(tmp_path):
    """Validation loss under PP x TP (schedule eval on the last stage) equals one process's."""
    args = [*PARITY, "train.max_steps=4", "train.eval_interval=2", "train.eval_steps=2"]
    one = train(tmp_path / "one", *args, "cluster.nproc_per_node=1")
    pp = train(tmp_path / "pp", *args, "cluster.nproc_per_node=4", "parallel.pp=2", "parallel.tp=2")
    want = {r["step"]: r["val_loss"] for r in one if "val_loss" in r}
    got = {r["step"]: r["val_loss"] for r in pp if "val_loss" in r}
    assert sorted(got) == sorted(want) == [2, 4]
    assert max(abs(got[s] - want[s]) for s in want) <= 1e-5


# ---- Llama: the same harness on llama-tiny's architecture at width 64 (4 query heads sharing 2 key/value heads of
# 16, SwiGLU width 192). Compile and recompute ride along on three layouts: they change no number at this
# tolerance.
LLAMA = [*PARITY, "model=llama-tiny"]
LLAMA_LAYOUTS = {
    "dp2_zero3_compile": (2, ["parallel.zero=3", "train.compile=true"]),
    "tp2_sp_gqa_selective_recompute": (2, ["parallel.tp=2", "parallel.sequence_parallel=true", "recompute=selective"]),
    "pp2_1f1b_full_recompute": (2, ["parallel.pp=2", "parallel.pp_schedule=1f1b", "recompute=full"]),
    "pp2_tp2_sp_interleaved_1f1b": (4, ["parallel.pp=2", "parallel.tp=2", "parallel.sequence_parallel=true",
                                        "parallel.pp_schedule=interleaved_1f1b", "parallel.virtual_stages=2"]),
}


@pytest.fixture(scope="module")
def llama_reference(tmp_path_factory):
    return by_step(train(tmp_path_factory.mktemp("llama-ref") / "run", *LLAMA, "cluster.nproc_per_node=1",
                         "train.loss=full"))


@pytest.mark.parametrize("name", list(LLAMA_LAYOUTS))
def test_llama_layout_matches_one_process(name, llama_reference, tmp_path):
    nproc, overrides = LLAMA_LAYOUTS[name]
    rows = train(tmp_path / name, *LLAMA, f"cluster.nproc_per_node={nproc}", *overrides)
    assert_parity(rows, llama_reference, f"llama {name}")


def test_llama_dp2_tp2_matches_and_its_checkpoint_resumes_under_pp2(llama_reference, tmp_path):
    """DP2 x TP2 (ZeRO-3, GQA heads split) over 10 steps, then its step-5 checkpoint resumed by a pipeline
    (PP2, 1F1B) in another run directory: steps 6..10 continue the one-process losses."""
    saved = tmp_path / "dp2_tp2"
    rows = train(saved, *LLAMA, "cluster.nproc_per_node=4", "parallel.tp=2", "parallel.zero=3",
                  "checkpoint.interval=5")
    assert_parity(rows, llama_reference, "llama dp2 x tp2")
    # Block matrices split 4 ways, k and v too: per layer q, proj 64 x 64, k, v 32 x 64, SwiGLU 3 x 64 x 192; fp32.
    block_bytes = 4 * (2 * 64 * 64 + 2 * 32 * 64 + 3 * 64 * 192) * 4
    assert [b["block_matrix_params"] for b in _state_bytes(saved, 4)] == [block_bytes // 4] * 4
    rows = train(tmp_path / "resumed", *LLAMA, "cluster.nproc_per_node=2", "parallel.pp=2",
                  f"checkpoint.resume={saved / 'checkpoints' / 'step-0000005'}")
    assert_parity(rows, llama_reference, "llama dp2 x tp2 -> pp2 from step 5", steps=range(6, 11))


def test_untied_llama_pp2_zbv_tp2_matches_one_process(tmp_path):
    """An untied head (Llama 3 8B's) lives on the last pipeline stage alone (here with the first, on rank 0 of a
    V-shaped schedule) and is column-parallel under TP."""
    untied = [*LLAMA, "model.tie_embeddings=false"]
    one = by_step(train(tmp_path / "one", *untied, "cluster.nproc_per_node=1"))
    rows = train(tmp_path / "pp2_tp2", *untied, "cluster.nproc_per_node=4", "parallel.pp=2", "parallel.tp=2",
                  "parallel.sequence_parallel=true", "parallel.pp_schedule=zbv", "parallel.virtual_stages=2")
    assert_parity(rows, one, "untied llama pp2 (zbv) x tp2")


def test_llama_fp16_with_loss_scaling_tracks_fp32_under_tp2(llama_reference, tmp_path):
    """fp16 autocast with dynamic loss scaling under TP2: within 2e-4 of the fp32 one-process losses at every step
    (measured 4.0e-5), the scale at its starting 2^16 with no step skipped."""
    rows = {r["step"]: r for r in train(tmp_path / "fp16", *LLAMA, "cluster.nproc_per_node=2", "parallel.tp=2",
                                         "precision=fp16") if "loss" in r}
    assert sorted(rows) == list(range(1, 11))
    diff = max(abs(rows[s]["loss"] - llama_reference[s]["loss"]) for s in rows)
    assert diff <= 2e-4, diff
    assert rows[10]["loss_scale"] == 65536.0 and rows[10]["skipped_steps"] == 0
