"""Context parallel trains the same model as one process (fp32, CPU + gloo): llama-tiny under cp2, cp4, cp2 with
tp2 and sequence parallel, cp2 x dp2 with ZeRO-3, cp2 x pp2 with full recompute, and GPT-2's learned positions
under cp2; each layout's loss, gradient norm and val_loss within 1e-5 of one process's over 10 steps. The cp2 x dp2
run's step-5 checkpoint resumes at cp1 and cp4 with the same losses (a checkpoint holds no trace of cp)."""

from __future__ import annotations

import pytest
from conftest import SMALL
from helpers.inprocess_run import train_in_process as train
from helpers.parity import assert_parity, by_step

pytestmark = pytest.mark.slow
COMMON = SMALL + ["train.max_steps=10", "train.global_batch_size=8", "train.micro_batch_size=2",
                  "train.eval_interval=5", "train.eval_steps=1"]
LLAMA = COMMON + ["model=llama-tiny"]

LAYOUTS = {
    # name: (processes, overrides)
    "cp2": (2, ["parallel.cp=2"]),
    "cp4": (4, ["parallel.cp=4"]),
    "cp2_tp2_sp": (4, ["parallel.cp=2", "parallel.tp=2", "parallel.sequence_parallel=true"]),
    "cp2_dp2_zero3": (4, ["parallel.cp=2", "parallel.zero=3", "checkpoint.interval=5"]),
    "cp2_pp2_full_recompute": (4, ["parallel.cp=2", "parallel.pp=2", "recompute=full"]),
}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return by_step(train(tmp_path_factory.mktemp("cp-ref") / "run", *LLAMA, "cluster.nproc_per_node=1"))


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """The cp2 x dp2 ZeRO-3 run, whose step-5 checkpoint the resume tests read: (run dir, rows)."""
    run_dir = tmp_path_factory.mktemp("cp-saved") / "run"
    nproc, overrides = LAYOUTS["cp2_dp2_zero3"]
    return run_dir, train(run_dir, *LLAMA, f"cluster.nproc_per_node={nproc}", *overrides)


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_layout_matches_one_process(name, reference, saved, tmp_path):
    nproc, overrides = LAYOUTS[name]
    rows = saved[1] if name == "cp2_dp2_zero3" else \
        train(tmp_path / name, *LLAMA, f"cluster.nproc_per_node={nproc}", *overrides)
    assert_parity(rows, reference, name)


@pytest.mark.parametrize("nproc, overrides", [(1, []), (4, ["parallel.cp=4"])])
def test_cp2_checkpoint_resumes_under_another_cp(nproc, overrides, reference, saved, tmp_path):
    checkpoint = saved[0] / "checkpoints" / "step-0000005"
    rows = train(tmp_path / "resumed", *LLAMA, f"cluster.nproc_per_node={nproc}", *overrides,
                 f"checkpoint.resume={checkpoint}")
    assert_parity(rows, reference, f"cp2 x dp2 -> {overrides or 'one process'} from step 5", steps=range(6, 11))


def test_gpt2_learned_positions_under_cp2(tmp_path):
    """Each rank's tokens take their own rows of the position table."""
    gpt = COMMON + ["model=gpt-tiny"]
    want = by_step(train(tmp_path / "ref", *gpt, "cluster.nproc_per_node=1"))
    assert_parity(train(tmp_path / "cp2", *gpt, "cluster.nproc_per_node=2", "parallel.cp=2"), want, "gpt cp2")
