"""Whether a launch would start a different run in a used run directory (launch/run_identity.conflict)."""

import json

from llmtrain.config.compose import compose_config
from llmtrain.launch.run_identity import conflict

CFG = compose_config([])


def checkpoint(run_dir, step, complete=True):
    path = run_dir / "checkpoints" / (f"step-{step:07d}" + ("" if complete else ".tmp"))
    path.mkdir(parents=True)
    if complete:
        (path / "meta.json").write_text(json.dumps({"step": step}))
    return str(path)


def test_an_empty_run_dir_is_no_conflict(tmp_path):
    assert conflict(CFG, str(tmp_path), None, None) == ("", [])


def test_a_fresh_start_over_checkpoints_is_another_run(tmp_path):
    first, second = checkpoint(tmp_path, 10), checkpoint(tmp_path, 20)
    why, move = conflict(CFG, str(tmp_path), None, None)
    assert why == (f"checkpoint.resume=none would start a new run in {tmp_path}, which holds the run saved in "
                   f"{second}")
    assert move == [first, second]


def test_resuming_the_newest_is_the_same_run(tmp_path):
    checkpoint(tmp_path, 10)
    newest = checkpoint(tmp_path, 20)
    checkpoint(tmp_path, 30, complete=False)  # an unfinished save is not newer
    assert conflict(CFG, str(tmp_path), newest, None) == ("", [])


def test_a_rollback_supersedes_only_the_newer_checkpoints(tmp_path):
    older, newer = checkpoint(tmp_path, 10), checkpoint(tmp_path, 20)
    why, move = conflict(CFG, str(tmp_path), older, None)
    assert why == f"resuming from step 10 in {tmp_path}, which holds newer checkpoints (step-0000020)"
    assert move == [newer]


def test_another_directory_s_checkpoint_is_another_run(tmp_path):
    here, elsewhere = tmp_path / "here", tmp_path / "elsewhere"
    newest = checkpoint(here, 10)
    foreign = checkpoint(elsewhere, 50)
    why, move = conflict(CFG, str(here), foreign, None)
    assert why == f"{foreign} belongs to another run directory, and {here} holds its own run (newest {newest})"
    assert move == [newest]


def test_another_seed_or_shape_over_the_newest_is_another_run(tmp_path):
    newest = checkpoint(tmp_path, 10)
    other = compose_config(["train.seed=7", "model.n_layers=3"])
    why, _ = conflict(other, str(tmp_path), newest, CFG)
    assert why.startswith(f"model.n_layers {CFG.model.n_layers} -> 3, train.seed {CFG.train.seed} -> 7 ")
    assert why.endswith(f"would start a new run in {tmp_path}, which holds the run saved in {newest}")
