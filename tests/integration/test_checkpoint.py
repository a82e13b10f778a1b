"""Checkpoints and resume: exact same-layout resume, resharded resume, restarts after a kill, preemption,
partial and corrupted checkpoints, `ckpt list`, and the names the model and optimizer state are saved under. What
only the trainer decides (resharding, async saves, model.init_from, the one-process reference) trains in-process
(helpers.inprocess_run), as do the runs the launcher's tests start from or compare with; the launcher's own paths
(resume messages, restarts, signals, kills) launch."""

from __future__ import annotations

import io
import json
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import SMALL, launch, read_rows, run_cli, train_losses, wait_for, worker_processes
from helpers.inprocess_run import train_in_process as train
from rich.console import Console

pytestmark = pytest.mark.slow
BASE = SMALL + ["train.max_steps=12", "train.global_batch_size=8", "train.micro_batch_size=2"]


def ckpt_steps(run_dir: Path) -> list[str]:
    return sorted(p.name for p in (run_dir / "checkpoints").iterdir())


def max_diff(a: dict, b: dict, steps) -> float:
    return max(abs(a[s] - b[s]) for s in steps)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """12 steps at DP2, never stopped; and the same on one process."""
    base = tmp_path_factory.mktemp("uninterrupted")
    train(base / "dp2", *BASE)
    train(base / "one", *BASE, "cluster.nproc_per_node=1")
    return {"dp2": train_losses(base / "dp2"), "one": train_losses(base / "one"), "dir": base}


def test_final_checkpoint_and_list(uninterrupted):
    run_dir = uninterrupted["dir"] / "dp2"
    assert ckpt_steps(run_dir) == ["step-0000012"]
    ckpt = run_dir / "checkpoints" / "step-0000012"
    meta = json.loads((ckpt / "meta.json").read_text())
    assert meta["complete"] and meta["step"] == 12 and meta["layout"]["dp"] == 2
    assert (ckpt / "config.yaml").is_file() and (ckpt / ".metadata").is_file()
    listing = run_cli(["ckpt", "list", str(run_dir)])
    assert listing.returncode == 0 and "12" in listing.stdout and "complete" in listing.stdout
    assert "dp=2" in listing.stdout


def test_stop_and_resume_same_layout_is_exact(uninterrupted, tmp_path):
    # Evaluation right before the save (and after the resume) must not disturb what is saved: FSDP2 leaves its
    # unsharded parameters registered after a no-grad forward.
    run_dir = tmp_path / "run"
    train(run_dir, *BASE, "train.stop_at_step=6", "checkpoint.keep=5", "train.eval_interval=3")
    assert ckpt_steps(run_dir) == ["step-0000006"]
    result = run_cli(["launch", f"run.dir={run_dir}", *BASE, "checkpoint.keep=5", "train.eval_interval=3"])
    assert result.returncode == 0, result.stderr[-2000:]
    assert "resuming from" in result.stdout
    losses = train_losses(run_dir)
    assert sorted(losses) == list(range(1, 13))
    diff = max_diff(losses, uninterrupted["dp2"], range(1, 13))
    assert diff <= 1e-6, f"resumed vs uninterrupted: {diff}"
    assert ckpt_steps(run_dir) == ["step-0000006", "step-0000012"]
    # Training time adds up over both launches: in metrics, the checkpoint and the final line.
    elapsed = {r["step"]: r["elapsed_s"] for r in read_rows(run_dir) if "loss" in r}
    saved = json.loads((run_dir / "checkpoints" / "step-0000006" / "meta.json").read_text())["elapsed_s"]
    assert elapsed[6] <= saved < elapsed[7] < elapsed[12]
    done = re.search(r"done, 12 steps, [\d,]+ tokens in ([\d.]+) s \(6 since resuming at step 6, in ([\d.]+) s\)",
                     result.stdout)
    assert done and float(done[1]) > saved and float(done[1]) >= float(done[2]), result.stdout[-2000:]
    # A third launch has nothing left to do, and says only that.
    again = run_cli(["launch", f"run.dir={run_dir}", *BASE, "checkpoint.keep=5", "train.eval_interval=3"])
    assert again.returncode == 0 and "nothing to do: already at step 12" in again.stdout
    assert "done," not in again.stdout, again.stdout


def test_resume_under_other_layouts(uninterrupted, tmp_path):
    """Saved at DP2 x TP2 with ZeRO-3 (4 ranks), resumed at PP2, at PP2 with a V-shaped schedule (rank 0 holds the
    first and the last of 4 stages: the embedding and the head's copy) and on one process. In-process: what is
    under test is the trainer's resharding; the launcher's part (the changes it names) runs as it does."""
    saved = tmp_path / "saved"
    train(saved, *BASE, "train.stop_at_step=6", "cluster.nproc_per_node=4", "parallel.tp=2", "parallel.zero=3")
    reference = uninterrupted["one"]
    assert max_diff(train_losses(saved), reference, range(1, 7)) <= 1e-5
    for name, overrides in {"pp2": ["cluster.nproc_per_node=2", "parallel.pp=2", "parallel.dp=1"],
                            "pp2_zbv": ["cluster.nproc_per_node=2", "parallel.pp=2", "parallel.dp=1",
                                        "parallel.pp_schedule=zbv", "parallel.virtual_stages=2"],
                            "one": ["cluster.nproc_per_node=1"]}.items():
        run_dir = tmp_path / name
        shutil.copytree(saved, run_dir)
        said = Console(record=True, width=200, file=io.StringIO())
        train(run_dir, *BASE, *overrides, console=said)
        # The launcher says what changed before training continues.
        assert "parallel.tp: 2 -> 1" in said.export_text() and "resharded" in (run_dir / "logs" / "rank0.log").read_text()
        losses = train_losses(run_dir)
        diff = max_diff(losses, reference, range(7, 13))
        assert diff <= 1e-5, f"{name}: resumed-under-another-layout vs reference: {diff}"


def test_model_shape_change_is_refused(uninterrupted, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(uninterrupted["dir"] / "dp2", run_dir)
    result = run_cli(["launch", f"run.dir={run_dir}", *BASE, "model.d_model=128", "train.max_steps=20"])
    assert result.returncode == 2
    # Another model shape is another run: refused, pointing to another run.dir or run.overwrite.
    assert result.stderr.startswith("llmtrain: error: run.dir: model.d_model 64 -> 128 would start a new run")
    assert "run.overwrite=true" in result.stderr


def test_partial_checkpoint_is_ignored_and_corrupt_one_is_named(uninterrupted, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(uninterrupted["dir"] / "dp2", run_dir)
    ckpts = run_dir / "checkpoints"
    # A save killed midway leaves a .tmp folder: it is ignored (and said so), the complete one is used.
    partial = ckpts / "step-0000013.tmp"
    shutil.copytree(ckpts / "step-0000012", partial)
    (partial / "meta.json").unlink()
    next(partial.glob("*.distcp")).write_bytes(b"\0" * 10)
    result = run_cli(["launch", f"run.dir={run_dir}", *BASE, "train.max_steps=14"])
    assert result.returncode == 0, result.stdout[-2000:]
    assert "ignoring incomplete checkpoint" in result.stdout and "step-0000013.tmp" in result.stdout
    assert result.stdout.count("ignoring incomplete checkpoint") == 1, result.stdout  # the launcher's word only
    assert sorted(train_losses(run_dir))[-2:] == [13, 14]
    # A truncated shard of the newest complete checkpoint: a clear error naming the file, nothing trained.
    newest = ckpts / "step-0000014"
    shard = sorted(newest.glob("*.distcp"))[0]
    shard.write_bytes(shard.read_bytes()[:-100])
    result = run_cli(["launch", f"run.dir={run_dir}", *BASE, "train.max_steps=16"])
    assert result.returncode == 1  # a damaged checkpoint is a failure, not bad input
    assert str(shard) in result.stderr and "truncated" in result.stderr
    # Flipped bytes of the same size are caught by the CRC.
    good = sorted((ckpts / "step-0000012").glob("*.distcp"))[0]
    data = bytearray(good.read_bytes())
    data[len(data) // 2] ^= 0xFF
    good.write_bytes(bytes(data))
    result = run_cli(["launch", f"run.dir={run_dir}", *BASE, f"checkpoint.resume={ckpts / 'step-0000012'}",
                      "train.max_steps=16"])
    assert result.returncode == 1 and str(good) in result.stderr and "corrupted" in result.stderr


def _start(run_dir, *overrides):
    return subprocess.Popen([sys.executable, "-m", "llmtrain", "launch", f"run.dir={run_dir}", *overrides],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_killed_rank_restarts_and_matches(uninterrupted, tmp_path):
    """kill -9 of one rank with launch.max_restarts=1: torchrun restarts the workers, they resume from the newest
    complete checkpoint, and the final losses equal the uninterrupted run's."""
    run_dir = tmp_path / "run"
    steps = 30
    overrides = [*BASE, f"train.max_steps={steps}", "checkpoint.interval=4", "launch.max_restarts=1"]
    reference_dir = tmp_path / "reference"
    train(reference_dir, *BASE, f"train.max_steps={steps}")
    proc = _start(run_dir, *overrides)
    try:
        assert wait_for(lambda: any(r.get("step", 0) >= 6 for r in read_rows(run_dir)), timeout=180)
        victims = [p for p in worker_processes(run_dir) if "llmtrain.worker" in " ".join(p.cmdline())
                   and p.environ().get("RANK") == "1"]
        assert victims
        victims[0].send_signal(signal.SIGKILL)
        out, _ = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 0, out[-3000:]
    status = json.loads((run_dir / "logs" / "rank0.status").read_text())
    assert status["restart"] == 1  # the job really restarted
    # The launcher says which rank died and that torchrun restarts; rank 0 says where it resumed.
    # torchrun may see rank 0's error (it lost its peer) in the same poll as the kill; rank 1 is named either way.
    assert re.search(r"rank 1 \(node 0, host \S+, local rank 1\) failed \((signal 9|ended without an error of its own: killed)\); "
                     r"torchrun restarts the workers \(restart 1 of 1\)", out), out
    assert re.search(r"restart 1 of 1: resumed from \S+/step-\d{7} at step \d+", out), out
    losses = train_losses(run_dir)
    assert sorted(losses) == list(range(1, steps + 1))
    diff = max_diff(losses, train_losses(reference_dir), range(1, steps + 1))
    assert diff <= 1e-6, f"restarted vs uninterrupted: {diff}"
    assert not worker_processes(run_dir)


def test_sigterm_checkpoints_and_resubmission_resumes(uninterrupted, tmp_path):
    run_dir = tmp_path / "run"
    steps = 400
    proc = _start(run_dir, *BASE, f"train.max_steps={steps}")
    try:
        assert wait_for(lambda: any(r.get("step", 0) >= 3 for r in read_rows(run_dir)), timeout=180)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=180)
    finally:
        proc.kill()
    assert proc.returncode == 143, out[-3000:]
    assert "preempted at step" in out and "checkpoint saved" in out
    assert out.count("preempted at step") == 1, out  # said once, by the launcher
    saved = [int(name.split("-")[1]) for name in ckpt_steps(run_dir)]
    assert len(saved) == 1 and 3 <= saved[0] < steps
    assert not worker_processes(run_dir)
    # The resubmitted job continues from the saved step, with the uninterrupted run's numbers.
    launch(run_dir, *BASE, f"train.max_steps={steps}", f"train.stop_at_step={saved[0] + 2}")
    losses = train_losses(run_dir)
    assert sorted(losses)[-2:] == [saved[0] + 1, saved[0] + 2]
    reference_dir = tmp_path / "reference"
    train(reference_dir, *BASE, f"train.max_steps={steps}", f"train.stop_at_step={saved[0] + 2}")
    assert max_diff(losses, train_losses(reference_dir), range(1, saved[0] + 3)) <= 1e-6


def test_async_checkpoint_is_logged_saved_only_when_complete(tmp_path):
    run_dir = tmp_path / "run"
    train(run_dir, *BASE, "checkpoint.interval=4", "checkpoint.async=true", "checkpoint.keep=10")
    log = (run_dir / "logs" / "rank0.log").read_text()
    assert "saving in the background" in log
    assert ckpt_steps(run_dir) == ["step-0000004", "step-0000008", "step-0000012"]
    for name in ckpt_steps(run_dir):
        # "saved" is printed only after meta.json (written last, with every file's CRC) exists
        assert f"saved checkpoint step {int(name[5:])} " in log
        assert json.loads((run_dir / "checkpoints" / name / "meta.json").read_text())["complete"]
    # The state is copied in the background while the next step runs; the copy still holds the weights of the
    # step it names, bit for bit, as a synchronous save of the same run does.
    from llmtrain.checkpoint.export import load_model_state

    sync_dir = tmp_path / "sync"
    train(sync_dir, *BASE, "checkpoint.interval=4", "checkpoint.keep=10")
    for name in ("step-0000004", "step-0000008"):
        got, _ = load_model_state(run_dir / "checkpoints" / name)
        want, _ = load_model_state(sync_dir / "checkpoints" / name)
        assert got.keys() == want.keys() and all(got[k].equal(want[k]) for k in want), name


def test_export_hf_matches_and_init_from_continues(uninterrupted, tmp_path):
    """`ckpt export --format hf` of a real DP2 checkpoint loads in transformers with the same logits, and
    model.init_from=<that folder> starts a run from exactly those weights."""
    import torch
    import torch.nn.functional as F

    from llmtrain.checkpoint.export import load_model_state
    from llmtrain.data import SampleStream, build_dataset
    from llmtrain.model import GPT, GPTArgs

    ckpt = uninterrupted["dir"] / "dp2" / "checkpoints" / "step-0000012"
    out = tmp_path / "hf"
    result = run_cli(["ckpt", "export", str(ckpt), "--format", "hf", "--out", str(out)])
    assert result.returncode == 0, result.stderr
    state, cfg = load_model_state(str(ckpt))
    model = GPT(GPTArgs.from_config(cfg.model))
    model.load_state_dict(state, strict=False)
    model.tie_weights()
    model.eval()
    ids = torch.randint(0, cfg.model.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours = model(ids)[..., : cfg.model.vocab_size]
    try:
        import transformers
    except ImportError:
        pytest.skip("transformers not installed: pip install transformers")
    hf = transformers.GPT2LMHeadModel.from_pretrained(str(out), local_files_only=True).eval()
    with torch.no_grad():
        theirs = hf(ids).logits
    assert (ours - theirs).abs().max().item() <= 1e-4

    # Expected first loss of a run initialized from the export: the trained weights on global batch 0.
    stream = SampleStream(build_dataset(cfg.data, cfg.model, cfg.train.seed), cfg.train.seed)
    with torch.no_grad():
        losses = [F.cross_entropy(model(x).flatten(0, 1), y.flatten())
                  for x, y in (stream.batch("train", 0, m, 0, 1, 2, 8) for m in range(4))]
    expected = torch.stack(losses).mean().item()
    run_dir = tmp_path / "init_from"
    rows = train(run_dir, *BASE, "train.max_steps=1", f"model.init_from={out}")
    first = [r for r in rows if "loss" in r][0]["loss"]
    assert abs(first - expected) <= 1e-5, (first, expected)
    assert first < uninterrupted["dp2"][1] - 0.3  # trained weights, not a fresh init
    # Rank 0 says what it loaded: every tensor, the parameters without the vocabulary's padding rows.
    count = sum(t[: cfg.model.vocab_size].numel() for t in state.values())
    log = (run_dir / "logs" / "rank0.log").read_text()
    assert f"llmtrain: model.init_from: loaded {len(state)} tensors ({count:,} parameters) from {out} (HF GPT-2)\n" \
        in log


def test_kill_during_a_save_keeps_the_previous_checkpoint(tmp_path):
    """SIGKILL of every process of the job while a checkpoint is being written (its .tmp folder exists): the
    previous checkpoint stays intact, the next launch ignores the partial one, says so, and resumes."""
    import psutil

    run_dir = tmp_path / "run"
    # ~30 MB of model + optimizer state per save, so the write takes long enough to be caught in the act.
    big = [*BASE, "model.d_model=256", "model.n_layers=4", "train.max_steps=40", "checkpoint.interval=3",
           "checkpoint.keep=5"]
    proc = _start(run_dir, *big)
    ckpts = run_dir / "checkpoints"
    try:
        def saving_after_first():
            names = [p.name for p in ckpts.iterdir()] if ckpts.exists() else []
            return any(n.endswith(".tmp") for n in names) and any(not n.endswith(".tmp") for n in names)

        assert wait_for(saving_after_first, timeout=180, interval=0.01), "never caught a save in progress"
        victims = [psutil.Process(proc.pid)] + psutil.Process(proc.pid).children(recursive=True)
        for p in victims:
            p.kill()
        proc.wait(timeout=30)
    finally:
        proc.kill()
    partial = [p for p in ckpts.iterdir() if p.name.endswith(".tmp")]
    complete = sorted(p for p in ckpts.iterdir() if not p.name.endswith(".tmp"))
    assert partial and complete
    result = run_cli(["launch", f"run.dir={run_dir}", *big, "train.stop_at_step=" + str(int(complete[-1].name[5:]) + 1)])
    assert result.returncode == 0, result.stdout[-3000:]
    assert "ignoring incomplete checkpoint" in result.stdout and partial[0].name in result.stdout
    assert f"resuming from {complete[-1]}" in result.stdout.replace("\n", "")


# ---- the state DCP saves, in one process ---------------------------------------------------------------------------


@pytest.fixture
def one_rank(tmp_path):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _gpt_and_adamw(stages: list[int]):
    """A 4-layer GPT as the pipeline stages `stages` of a 2-stage split held by one rank (both ends: the last
    stage's head is a copy of the embedding), or whole for [], with AdamW over all of it."""
    import torch
    from omegaconf import OmegaConf

    from llmtrain.model import GPT, GPTArgs, init_parameters
    from llmtrain.parallel.pipeline import make_stage_module
    from llmtrain.train.optim import build_optimizer

    with torch.device("meta"):
        whole = GPT(GPTArgs(n_layers=4, n_heads=2, d_model=16, vocab_size=32, seq_len=8))
    parts = [make_stage_module(whole, s, [2, 2]) for s in stages] or [whole]
    for part in parts:
        part.to_empty(device="cpu")
        part.tie_weights()
        init_parameters(part, seed=0, std=0.02, n_layers=4)
    train = OmegaConf.create({"lr": 1e-2, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.1})
    return parts, build_optimizer(parts, train)


def _train_step(parts, optimizer, seed: int) -> float:
    """One AdamW step on a fixed batch; a pipeline's head copy takes the embedding's gradient summed with its own,
    as the trainer does."""
    import torch
    import torch.nn.functional as F

    ids = torch.randint(0, 32, (2, 9), generator=torch.Generator().manual_seed(seed))
    h = ids[:, :-1]
    for part in parts:
        h = part(h)
    loss = F.cross_entropy(h.flatten(0, 1), ids[:, 1:].flatten())
    loss.backward()
    params = {n: p for part in parts for n, p in part.named_parameters()}
    if len(parts) > 1:
        total = params["embed.tok.weight"].grad + params["head.weight"].grad
        params["embed.tok.weight"].grad, params["head.weight"].grad = total, total.clone()
    optimizer.step()
    optimizer.zero_grad()
    return loss.item()


def test_state_is_saved_by_parameter_name_and_loads_into_two_stages_on_one_rank(tmp_path, one_rank):
    """The saved names are the parameter names (what checkpoints of every layout and of earlier versions hold):
    a checkpoint written by hand in that layout loads into two pipeline stages held by one rank, whose next
    step then matches the whole model's; the head copy gets the embedding's value and moments, not shared ones."""
    import torch
    import torch.distributed.checkpoint as dcp

    from llmtrain.checkpoint.state import ModelState, OptimizerState

    parts, optimizer = _gpt_and_adamw([])
    fresh = OptimizerState(parts, optimizer)
    assert fresh.state_dict() == {} and not optimizer.state  # nothing to save yet, and no step taken to save it
    for seed in range(3):
        _train_step(parts, optimizer, seed)
    model = parts[0]
    by_hand = {"model": dict(model.named_parameters()),
               "optim": {f"{n}.{field}": value for n, p in model.named_parameters()
                         for field, value in optimizer.state[p].items()}}
    dcp.save(by_hand, checkpoint_id=tmp_path / "by_hand")
    dcp.save({"model": ModelState(parts), "optim": OptimizerState(parts, optimizer)}, checkpoint_id=tmp_path / "one")
    keys = set(dcp.FileSystemReader(tmp_path / "one").read_metadata().state_dict_metadata)
    assert keys == set(dcp.FileSystemReader(tmp_path / "by_hand").read_metadata().state_dict_metadata)
    assert {"model.embed.tok.weight", "optim.embed.tok.weight.exp_avg", "optim.layers.3.mlp.fc.weight.step"} < keys
    assert not any(k.startswith(("model.head", "optim.head")) for k in keys)  # the tied head: saved once

    stages, stage_optimizer = _gpt_and_adamw([0, 1])
    dcp.load({"model": ModelState(stages), "optim": OptimizerState(stages, stage_optimizer, for_load=True)},
             checkpoint_id=tmp_path / "by_hand")
    params = {n: p for part in stages for n, p in part.named_parameters()}
    embed, head = params["embed.tok.weight"], params["head.weight"]
    assert torch.equal(head, embed) and torch.equal(embed, model.embed.tok.weight)
    head_state, embed_state = stage_optimizer.state[head], stage_optimizer.state[embed]
    assert torch.equal(head_state["exp_avg"], embed_state["exp_avg"])
    assert head_state["exp_avg"].data_ptr() != embed_state["exp_avg"].data_ptr()
    assert {float(s["step"]) for s in stage_optimizer.state.values()} == {3.0}
    assert [g["lr"] for g in stage_optimizer.param_groups] == [1e-2, 1e-2]
    before = model.layers["3"].mlp.fc.weight.detach().clone()
    assert _train_step(stages, stage_optimizer, 3) == pytest.approx(_train_step(parts, optimizer, 3), abs=1e-6)
    for name, p in model.named_parameters():
        assert (params[name] - p).abs().max().item() <= 1e-6, name
    assert (model.layers["3"].mlp.fc.weight - before).abs().max().item() > 1e-4  # the step moved the weights
    # Saved from the two stages: the same names as from the whole model.
    dcp.save({"model": ModelState(stages), "optim": OptimizerState(stages, stage_optimizer)},
             checkpoint_id=tmp_path / "two")
    assert set(dcp.FileSystemReader(tmp_path / "two").read_metadata().state_dict_metadata) == keys


def test_an_untied_head_is_saved_under_its_own_name():
    """A tied head is saved once, as the embedding; an untied one (model.tie_embeddings=false) is a parameter of
    its own in the checkpoint, and loading puts it back. In-process, no process group."""
    import torch

    from llmtrain.checkpoint.state import ModelState
    from llmtrain.config import compose_config
    from llmtrain.model import build_model

    for tie in (True, False):
        cfg = compose_config(["model=llama-tiny", f"model.tie_embeddings={str(tie).lower()}"])
        torch.manual_seed(0)
        model = build_model(cfg.model)
        saved = ModelState([model]).state_dict()
        assert ("head.weight" in saved) is (not tie)
    assert torch.equal(saved["head.weight"], model.head.weight)
    assert not torch.equal(saved["head.weight"], saved["embed.tok.weight"])
    other = build_model(cfg.model)
    ModelState([other]).load_state_dict({name: value.clone() for name, value in saved.items()})
    assert torch.equal(other.head.weight, model.head.weight)
    assert torch.equal(other.embed.tok.weight, model.embed.tok.weight)
