"""TrainingState's round trip through its state_dict (alone and through a real DCP save and load by the checkpoint
manager), and the checkpoint.resume resolver: auto, none, PATH, and what a worker resolves at start, after a
restart and in a requeued job. In-process, no launch."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import pytest
import torch

from llmtrain.checkpoint import store
from llmtrain.checkpoint.resume import Resolution, resolve_in_worker, resolve_resume
from llmtrain.checkpoint.training_state import TrainingState
from llmtrain.train.loss_scale import DynamicLossScaler


def scaler(scale: float = 1024.0) -> DynamicLossScaler:
    return DynamicLossScaler(scale, 2.0, 0.5, 100, enabled=True)


class History:
    """A data feed's mixture history: its segments as JSON text; loading other weights starts a new segment."""

    def __init__(self, weights: dict):
        self.weights, self.loaded = weights, None

    def state_text(self, samples_seen: int) -> str:
        return json.dumps({"segments": [{"start": 0, "weights": self.weights}], "at": samples_seen})

    def load_state_text(self, text: str, samples_seen: int) -> bool:
        self.loaded = (json.loads(text), samples_seen)
        return self.loaded[0]["segments"][-1]["weights"] != self.weights


# ---- TrainingState ----------------------------------------------------------------------------------------------


def test_state_dict_has_the_keys_every_checkpoint_has():
    state = TrainingState(scaler(), step=7, samples_seen=56, tokens_seen=7168)
    assert state.state_dict() == {"step": 7, "samples_seen": 56, "tokens_seen": 7168,
                                  "scaler": {"scale": 1024.0, "good_steps": 0, "skipped_steps": 0}}


def test_round_trip_restores_counters_and_the_loss_scaler():
    before = TrainingState(scaler(), step=3, samples_seen=24, tokens_seen=3072)
    before.scaler.update(overflow=True)  # 1024 -> 512
    before.scaler.update(overflow=False)
    saved = before.state_dict()
    after = TrainingState(scaler())
    after.load_state_dict(saved)
    assert (after.step, after.samples_seen, after.tokens_seen) == (3, 24, 3072)
    assert after.scaler.state_dict() == {"scale": 512.0, "good_steps": 1, "skipped_steps": 1}
    assert after.state_dict() == saved and not after.new_mixture_segment


def test_the_mixture_history_travels_as_text_and_a_weight_change_is_reported():
    saved = TrainingState(scaler(), History({"web": 0.7}), step=2, samples_seen=16).state_dict()
    assert json.loads(saved["mixture"]) == {"segments": [{"start": 0, "weights": {"web": 0.7}}], "at": 16}
    assert "mixture" not in TrainingState(scaler(), History({"web": 0.7})).state_dict(mixture=False)
    same, other = History({"web": 0.7}), History({"web": 0.5})
    for history, changed in ((same, False), (other, True)):
        state = TrainingState(scaler(), history)
        state.load_state_dict(saved)
        assert history.loaded == (json.loads(saved["mixture"]), 16)
        assert state.new_mixture_segment is changed


def test_advance_and_the_training_clock():
    state = TrainingState(scaler(), elapsed_before_s=100.0)
    state.advance(samples=8, tokens=1024)
    state.advance(samples=8, tokens=1024)
    assert (state.step, state.samples_seen, state.tokens_seen) == (2, 16, 2048)
    state.segment_start = time.perf_counter() - 5.0
    assert 105.0 <= state.elapsed_s() < 106.0
    state.restart_clock()
    assert 100.0 <= state.elapsed_s() < 101.0


@pytest.fixture
def one_rank(tmp_path):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_the_manager_saves_and_restores_the_state_it_was_handed(tmp_path, one_rank):
    """Through DCP and back: the manager restores the TrainingState in place, and the training time from
    meta.json; nothing else is needed of a trainer."""
    from omegaconf import OmegaConf
    from torch.distributed.checkpoint import FileSystemReader

    from llmtrain.checkpoint.manager import CheckpointManager

    cfg = OmegaConf.create({"parallel": {"dp": 1, "tp": 1, "pp": 1, "zero": 0, "virtual_stages": 1},
                            "cluster": {"nnodes": 1, "nproc_per_node": 1}, "checkpoint": {"keep": 2},
                            "model": {"d_model": 8}, "train": {"seed": 0}})
    model = torch.nn.Linear(8, 8)
    model.args = SimpleNamespace(tie_embeddings=False)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.ones(2, 8)).sum().backward()
    optimizer.step()  # the optimizer has state to save
    state = TrainingState(scaler(), History({"web": 0.7}), step=5, samples_seen=40, tokens_seen=5120,
                          elapsed_before_s=30.0)
    state.scaler.update(overflow=True)
    lines: list[str] = []
    CheckpointManager(cfg, str(tmp_path), lambda line, **_: lines.append(line), model, optimizer,
                      state).save(asynchronous=False)
    path = str(tmp_path / "checkpoints" / "step-0000005")
    assert 30.0 <= store.read_meta(path)["elapsed_s"] < 40.0
    # The keys checkpoints have always had (a checkpoint saved before TrainingState existed loads the same way).
    keys = FileSystemReader(path).read_metadata().state_dict_metadata
    assert sorted(k for k in keys if k.startswith("extra.")) == [
        "extra.mixture", "extra.samples_seen", "extra.scaler.good_steps", "extra.scaler.scale",
        "extra.scaler.skipped_steps", "extra.step", "extra.tokens_seen"]

    fresh = TrainingState(scaler(), History({"web": 0.5}))
    CheckpointManager(cfg, str(tmp_path), lambda line, **_: lines.append(line), model, optimizer,
                      fresh).load(path)
    assert (fresh.step, fresh.samples_seen, fresh.tokens_seen) == (5, 40, 5120)
    assert fresh.scaler.state_dict() == {"scale": 512.0, "good_steps": 0, "skipped_steps": 1}
    assert fresh.elapsed_before_s == store.read_meta(path)["elapsed_s"] and fresh.new_mixture_segment
    assert lines[-2:] == [
        "llmtrain: data.sources weights differ from the checkpoint's: a new mixture segment starts at sample 40 "
        "(nothing already drawn is drawn again)",
        f"llmtrain: resumed from {path} at step 5 (40 samples seen)"]


# ---- the resolver -----------------------------------------------------------------------------------------------


def checkpoint(run, step: int, complete: bool = True):
    folder = run / "checkpoints" / (f"step-{step:07d}" + ("" if complete else ".tmp"))
    folder.mkdir(parents=True)
    if complete:
        (folder / "meta.json").write_text(json.dumps({"step": step, "complete": True, "files": {}}))
    return folder


def test_auto_without_checkpoints_is_a_fresh_start(tmp_path):
    run = tmp_path / "run"
    got = resolve_resume(str(run), "auto")
    assert (got.checkpoint, got.why, got.ignored) == (None, f"auto: no complete checkpoint in {run / 'checkpoints'}",
                                                      ())
    assert got.line() == f"llmtrain: checkpoint.resume=auto -> a fresh start (auto: no complete checkpoint in " \
                         f"{run / 'checkpoints'})"


def test_auto_takes_the_newest_complete_checkpoint_and_names_the_partial_ones(tmp_path):
    run = tmp_path / "run"
    checkpoint(run, 4)
    assert resolve_resume(str(run), "auto") == Resolution("auto", str(run / "checkpoints" / "step-0000004"),
                                                          "auto: newest complete checkpoint step-0000004")
    checkpoint(run, 2)
    checkpoint(run, 8)
    checkpoint(run, 12, complete=False)  # a save that did not finish
    got = resolve_resume(str(run), "auto")
    assert got.checkpoint == str(run / "checkpoints" / "step-0000008")
    assert got.why == "auto: newest complete checkpoint step-0000008"
    assert [i.path for i in got.ignored] == [str(run / "checkpoints" / "step-0000012.tmp")]


def test_auto_with_only_an_incomplete_checkpoint_is_a_fresh_start_that_names_it(tmp_path):
    run = tmp_path / "run"
    checkpoint(run, 3, complete=False)
    got = resolve_resume(str(run), "auto")
    assert got.checkpoint is None and [i.step for i in got.ignored] == [3]


def test_none_is_a_fresh_start_even_over_checkpoints(tmp_path):
    run = tmp_path / "run"
    checkpoint(run, 4)
    assert resolve_resume(str(run), "none") == Resolution("none", None, "none: a fresh start")


def test_a_path_is_taken_as_given(tmp_path, monkeypatch):
    other = checkpoint(tmp_path / "other", 6)
    checkpoint(tmp_path / "run", 9)  # newer, but not what was asked for
    assert resolve_resume(str(tmp_path / "run"), str(other)) == Resolution(str(other), str(other), "PATH as given")
    monkeypatch.chdir(tmp_path)
    relative = resolve_resume(str(tmp_path / "run"), "other/checkpoints/step-0000006")
    assert relative.value == "other/checkpoints/step-0000006" and relative.checkpoint == str(other)


@pytest.mark.parametrize("make,said", [
    (lambda run: run / "missing", "no such checkpoint folder: {value}"),
    (lambda run: checkpoint(run, 5, complete=False), "{value} is not a complete checkpoint (its save did not finish)"),
    (lambda run: (run / "weights").mkdir(parents=True) or run / "weights",
     "{value} is not a complete checkpoint (no meta.json)"),
])
def test_a_path_that_is_no_complete_checkpoint_is_an_error_naming_the_key(tmp_path, make, said):
    value = str(make(tmp_path / "run"))
    with pytest.raises(store.CheckpointError) as e:
        resolve_resume(str(tmp_path / "run"), value)
    assert e.value.key == "checkpoint.resume" and e.value.message == said.format(value=value)
    assert str(e.value).startswith("checkpoint.resume: ")


# ---- what a worker resolves ---------------------------------------------------------------------------------------


def test_a_worker_starts_from_what_the_launcher_recorded(tmp_path):
    run = tmp_path / "run"
    older = checkpoint(run, 2)
    checkpoint(run, 4)
    launched = Resolution.from_record({"value": "auto", "checkpoint": str(older), "why": "auto: newest complete "
                                       "checkpoint step-0000002"}, "auto")
    got = resolve_in_worker(str(run), "auto", launched, restart=0, requeued=0)
    assert got == Resolution("auto", str(older), "as the launcher resolved it: auto: newest complete checkpoint "
                                                 "step-0000002")


def test_a_record_made_for_another_value_is_not_taken(tmp_path):
    record = {"value": "none", "checkpoint": None, "why": "none: a fresh start"}
    assert Resolution.from_record(record, "auto") is None
    assert Resolution.from_record(None, "auto") is None and Resolution.from_record({"value": "auto"}, "auto") is None
    run = tmp_path / "run"
    newest = checkpoint(run, 4)
    got = resolve_in_worker(str(run), "auto", Resolution.from_record(record, "auto"), restart=0, requeued=0)
    assert got.checkpoint == str(newest) and got.why == "auto: newest complete checkpoint step-0000004"


@pytest.mark.parametrize("restart,requeued,cause", [(1, 0, "restart 1"), (0, 2, "requeued job (restart 2)")])
def test_a_restart_or_requeue_continues_from_the_newest_checkpoint_whatever_was_written(tmp_path, restart, requeued,
                                                                                      cause):
    run = tmp_path / "run"
    older = checkpoint(run, 2)
    checkpoint(run, 6)
    checkpoint(run, 8, complete=False)
    launched = Resolution(str(older), str(older), "PATH as given")
    got = resolve_in_worker(str(run), str(older), launched, restart, requeued)
    assert got.checkpoint == str(run / "checkpoints" / "step-0000006")
    assert got.why == f"{cause}: auto: newest complete checkpoint step-0000006" and len(got.ignored) == 1
    assert resolve_in_worker(str(run), "none", None, restart, requeued).checkpoint == got.checkpoint


def test_the_dry_run_says_what_resume_resolves_to_and_refuses_a_missing_path(tmp_path, capsys):
    from llmtrain.cli import main

    run = tmp_path / "run"
    newest = checkpoint(run, 4)
    assert main(["launch", "--dry-run", f"run.dir={run}"]) == 0
    said = [line for line in capsys.readouterr().out.splitlines() if "checkpoint.resume=" in line]
    assert said == [f"llmtrain: checkpoint.resume=auto -> {newest} (auto: newest complete checkpoint step-0000004)"]
    assert main(["launch", "--dry-run", f"run.dir={run}", f"checkpoint.resume={tmp_path / 'nope'}"]) == 2
    assert capsys.readouterr().err == f"llmtrain: error: checkpoint.resume: no such checkpoint folder: " \
                                      f"{tmp_path / 'nope'}\n"


def test_a_restart_before_the_first_save_goes_back_to_the_checkpoint_the_run_began_from(tmp_path):
    other = checkpoint(tmp_path / "other", 5)  # another run directory's checkpoint, resumed into an empty one
    run = tmp_path / "run"
    launched = Resolution(str(other), str(other), "PATH as given")
    got = resolve_in_worker(str(run), str(other), launched, restart=1, requeued=0)
    assert got.checkpoint == str(other)
    assert got.why == "restart 1: no checkpoint saved here yet, so the one the run began from (PATH as given)"
    assert resolve_in_worker(str(run), "none", None, restart=1, requeued=0).checkpoint is None
    assert resolve_in_worker(str(run), "auto", None, restart=0, requeued=1).checkpoint is None
