"""Checkpoints and resume: exact same-layout resume, resharded resume, restarts after a kill, preemption,
partial and corrupted checkpoints, `ckpt list` (the names the state is saved under: test_checkpoint_state.py). What
only the trainer decides (resharding, async saves, model.init_from, the one-process reference) trains in-process
(helpers.inprocess_run), as do the runs the launcher's tests start from or compare with; the launcher's own paths
(resume messages, restarts, signals, kills) launch, and what it answers before any worker starts (nothing to do,
a refused change, a damaged checkpoint) runs through main() in this process."""

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

from llmtrain.cli import main

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


# The kill and SIGTERM tests' schedule: 400 steps planned, so a SIGTERM lands mid-run; the reference trains 30.
LONG = [*BASE, "train.max_steps=400"]
LONG_STEPS = 30


@pytest.fixture(scope="module")
def long_reference(tmp_path_factory):
    """DP2 on LONG's schedule, never stopped before step 30: the losses the restarted and the resubmitted launches
    must reproduce."""
    run_dir = tmp_path_factory.mktemp("long-reference") / "run"
    train(run_dir, *LONG, f"train.stop_at_step={LONG_STEPS}")
    return train_losses(run_dir)


def test_final_checkpoint_and_list(uninterrupted, capsys):
    run_dir = uninterrupted["dir"] / "dp2"
    assert ckpt_steps(run_dir) == ["step-0000012"]
    ckpt = run_dir / "checkpoints" / "step-0000012"
    meta = json.loads((ckpt / "meta.json").read_text())
    assert meta["complete"] and meta["step"] == 12 and meta["layout"]["dp"] == 2
    assert (ckpt / "config.yaml").is_file() and (ckpt / ".metadata").is_file()
    capsys.readouterr()
    assert main(["ckpt", "list", str(run_dir)]) == 0
    listing = capsys.readouterr().out
    assert "12" in listing and "complete" in listing and "dp=2" in listing, listing


RESUMED = [*BASE, "checkpoint.keep=5", "train.eval_interval=3"]


@pytest.fixture(scope="module")
def resumed(tmp_path_factory):
    """Stopped at step 6 in-process, then resumed to step 12 by `llmtrain launch`, with a save killed midway beside
    the step-6 checkpoint (a step-0000007.tmp folder without meta.json, a shard cut short): one launch that the
    exact-resume and the partial-checkpoint tests both read."""
    run_dir = tmp_path_factory.mktemp("resumed") / "run"
    train(run_dir, *RESUMED, "train.stop_at_step=6")
    stopped = ckpt_steps(run_dir)
    ckpts = run_dir / "checkpoints"
    partial = ckpts / "step-0000007.tmp"
    shutil.copytree(ckpts / "step-0000006", partial)
    (partial / "meta.json").unlink()
    next(partial.glob("*.distcp")).write_bytes(b"\0" * 10)
    result = run_cli(["launch", f"run.dir={run_dir}", *RESUMED])
    return {"dir": run_dir, "stopped": stopped, "partial": partial.name, "result": result}


def test_stop_and_resume_same_layout_is_exact(uninterrupted, resumed, capsys):
    # Evaluation right before the save (and after the resume) must not disturb what is saved: FSDP2 leaves its
    # unsharded parameters registered after a no-grad forward.
    run_dir, result = resumed["dir"], resumed["result"]
    assert resumed["stopped"] == ["step-0000006"]
    assert result.returncode == 0, result.stderr[-2000:]
    assert "resuming from" in result.stdout
    losses = train_losses(run_dir)
    assert sorted(losses) == list(range(1, 13))
    diff = max_diff(losses, uninterrupted["dp2"], range(1, 13))
    assert diff <= 1e-6, f"resumed vs uninterrupted: {diff}"
    assert ckpt_steps(run_dir) == ["step-0000006", "step-0000012"]  # the partial folder removed at the start
    # Training time adds up over both launches: in metrics, the checkpoint and the final line.
    elapsed = {r["step"]: r["elapsed_s"] for r in read_rows(run_dir) if "loss" in r}
    saved = json.loads((run_dir / "checkpoints" / "step-0000006" / "meta.json").read_text())["elapsed_s"]
    assert elapsed[6] <= saved < elapsed[7] < elapsed[12]
    done = re.search(r"done, 12 steps, [\d,]+ tokens in ([\d.]+) s \(6 since resuming at step 6, in ([\d.]+) s\)",
                     result.stdout)
    assert done and float(done[1]) > saved and float(done[1]) >= float(done[2]), result.stdout[-2000:]
    # A third launch has nothing left to do, and says only that; through main() in this process: it starts no
    # worker.
    capsys.readouterr()
    assert main(["launch", f"run.dir={run_dir}", *RESUMED]) == 0
    again = capsys.readouterr().out
    assert "nothing to do: already at step 12" in again and "done," not in again, again


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


def test_model_shape_change_is_refused(uninterrupted, tmp_path, capsys):
    run_dir = tmp_path / "run"
    shutil.copytree(uninterrupted["dir"] / "dp2", run_dir)
    # Refused before any worker starts: through main() in this process.
    assert main(["launch", f"run.dir={run_dir}", *BASE, "model.d_model=128", "train.max_steps=20"]) == 2
    err = capsys.readouterr().err
    # Another model shape is another run: refused, pointing to another run.dir or run.overwrite.
    assert err.startswith("llmtrain: error: run.dir: model.d_model 64 -> 128 would start a new run"), err
    assert "run.overwrite=true" in err


def test_partial_checkpoint_is_ignored_and_corrupt_one_is_named(resumed, tmp_path, capsys):
    # A save killed midway leaves a .tmp folder: it is ignored (and said so), the complete one is used.
    result = resumed["result"]
    assert result.returncode == 0, result.stdout[-2000:]
    assert "ignoring incomplete checkpoint" in result.stdout and resumed["partial"] in result.stdout
    assert result.stdout.count("ignoring incomplete checkpoint") == 1, result.stdout  # the launcher's word only
    assert sorted(train_losses(resumed["dir"]))[-6:] == [7, 8, 9, 10, 11, 12]
    run_dir = tmp_path / "run"
    shutil.copytree(resumed["dir"], run_dir)
    ckpts = run_dir / "checkpoints"
    # A truncated shard of the newest complete checkpoint: a clear error naming the file, nothing trained. Both
    # refusals come before any worker starts: through main() in this process.
    newest = ckpts / "step-0000012"
    shard = sorted(newest.glob("*.distcp"))[0]
    shard.write_bytes(shard.read_bytes()[:-100])
    capsys.readouterr()
    code = main(["launch", f"run.dir={run_dir}", *RESUMED, "train.max_steps=16"])
    err = capsys.readouterr().err
    assert code == 1  # a damaged checkpoint is a failure, not bad input
    assert str(shard) in err and "truncated" in err, err
    # Flipped bytes of the same size are caught by the CRC.
    good = sorted((ckpts / "step-0000006").glob("*.distcp"))[0]
    data = bytearray(good.read_bytes())
    data[len(data) // 2] ^= 0xFF
    good.write_bytes(bytes(data))
    code = main(["launch", f"run.dir={run_dir}", *RESUMED, f"checkpoint.resume={ckpts / 'step-0000006'}",
                 "train.max_steps=16"])
    err = capsys.readouterr().err
    assert code == 1 and str(good) in err and "corrupted" in err, err


def _start(run_dir, *overrides):
    return subprocess.Popen([sys.executable, "-m", "llmtrain", "launch", f"run.dir={run_dir}", *overrides],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_killed_rank_restarts_and_matches(long_reference, tmp_path):
    """kill -9 of one rank with launch.max_restarts=1: torchrun restarts the workers, they resume from the newest
    complete checkpoint, and the final losses equal the uninterrupted run's."""
    run_dir = tmp_path / "run"
    steps = LONG_STEPS
    overrides = [*LONG, f"train.stop_at_step={steps}", "checkpoint.interval=4", "launch.max_restarts=1"]
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
    diff = max_diff(losses, long_reference, range(1, steps + 1))
    assert diff <= 1e-6, f"restarted vs uninterrupted: {diff}"
    assert not worker_processes(run_dir)


def test_sigterm_checkpoints_and_resubmission_resumes(long_reference, tmp_path):
    run_dir = tmp_path / "run"
    steps = 400
    proc = _start(run_dir, *LONG)
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
    launch(run_dir, *LONG, f"train.stop_at_step={saved[0] + 2}")
    losses = train_losses(run_dir)
    assert sorted(losses)[-2:] == [saved[0] + 1, saved[0] + 2]
    reference = long_reference
    if saved[0] + 2 > LONG_STEPS:  # preempted later than the shared reference reaches: one of its own
        train(tmp_path / "reference", *LONG, f"train.stop_at_step={saved[0] + 2}")
        reference = train_losses(tmp_path / "reference")
    assert max_diff(losses, reference, range(1, saved[0] + 3)) <= 1e-6


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


def test_export_hf_matches_and_init_from_continues(uninterrupted, tmp_path, capsys):
    """`ckpt export --format hf` of a real DP2 checkpoint loads in transformers with the same logits, and
    model.init_from=<that folder> starts a run from exactly those weights. The export runs through the CLI's main()
    in this process: torch is imported already."""
    import torch
    import torch.nn.functional as F

    from llmtrain.checkpoint.export import load_model_state
    from llmtrain.data import SampleStream, build_dataset
    from llmtrain.model import GPT, GPTArgs

    ckpt = uninterrupted["dir"] / "dp2" / "checkpoints" / "step-0000012"
    out = tmp_path / "hf"
    code = main(["ckpt", "export", str(ckpt), "--format", "hf", "--out", str(out)])
    assert code == 0, capsys.readouterr().err
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


def test_kill_during_a_save_keeps_the_previous_checkpoint(tmp_path, capsys):
    """SIGKILL of every process of the job while a checkpoint is being written (its .tmp folder exists): the
    previous checkpoint stays intact, the next launch (through main() in this process) ignores the partial one, says
    so, resumes from the previous one and trains the step after it."""
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
    step = int(complete[-1].name[5:])
    capsys.readouterr()
    code = main(["launch", f"run.dir={run_dir}", *big, f"train.stop_at_step={step + 1}"])
    out = capsys.readouterr().out
    assert code == 0, out[-3000:]
    assert "ignoring incomplete checkpoint" in out and partial[0].name in out
    assert f"resuming from {complete[-1]}" in out.replace("\n", "")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert any(r.get("step") == step + 1 and "loss" in r for r in rows), rows[-3:]
