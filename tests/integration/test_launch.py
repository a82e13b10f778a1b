"""`llmtrain launch` end to end: DP parity, failures named by rank, no process left behind, --dry-run."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from omegaconf import OmegaConf
from conftest import REPO, SMALL, launch, read_rows, run_cli, train_losses, wait_for, worker_processes
from helpers.inprocess_run import train_in_process

pytestmark = pytest.mark.slow
PARITY = SMALL + ["train.max_steps=10", "train.global_batch_size=8", "train.micro_batch_size=2"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """One process, gradient accumulation over the whole global batch (trained in-process: what is compared with it
    goes through `llmtrain launch`)."""
    run_dir = tmp_path_factory.mktemp("ref") / "run"
    train_in_process(run_dir, *PARITY, "cluster.nproc_per_node=1")
    return train_losses(run_dir)


def test_dp2_matches_one_process(reference, tmp_path):
    losses = train_losses(tmp_path / "dp2") if launch(tmp_path / "dp2", *PARITY) else {}
    assert sorted(losses) == list(range(1, 11))
    diff = max(abs(losses[s] - reference[s]) for s in reference)
    assert diff <= 1e-5, f"DP2 vs 1 process: max |loss diff| = {diff}"
    # The loss actually moves: parity of a constant would prove nothing.
    assert reference[10] < reference[1] - 0.3


def test_run_directory_layout(reference, tmp_path):
    run_dir = tmp_path / "run"
    rows = launch(run_dir, *SMALL, "train.max_steps=4", "train.eval_interval=2", "train.eval_steps=1")
    assert (run_dir / "config.yaml").is_file()
    assert {p.name for p in (run_dir / "logs").iterdir()} >= {"rank0.log", "rank1.log", "node0.log",
                                                               "rank0.status", "rank1.status"}
    train = [r for r in rows if "loss" in r]
    assert [r["step"] for r in train] == [1, 2, 3, 4]
    for key in ("step", "loss", "lr", "grad_norm", "tokens_per_s"):
        assert all(isinstance(r[key], (int, float)) for r in train), key
    assert [r["step"] for r in rows if "val_loss" in r] == [2, 4]
    log = (run_dir / "logs" / "rank0.log").read_text().splitlines()
    assert "step      4/4" in "\n".join(log)
    # A CPU has no known peak: no MFU in the rows or the step lines, and one line saying why.
    assert [line for line in log if "MFU" in line] == [
        "llmtrain: MFU not shown: no known peak for this CPU; give its dense peak with "
        "+hardware.peak_tflops.float32=<TFLOPS> to show it"]
    assert not any("mfu" in r for r in rows)


def test_dry_run_starts_nothing(tmp_path):
    run_dir = tmp_path / "run"
    result = run_cli(["launch", "--dry-run", f"run.dir={run_dir}", "parallel.tp=2", "cluster.nproc_per_node=2"])
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "torch.distributed.run" in out and "--nproc-per-node=2" in out and "llmtrain.worker" in out
    assert "OMP_NUM_THREADS=" in out and "rank layout" in out
    assert "tp: 2" in out  # the resolved config
    assert not run_dir.exists() and not worker_processes(run_dir)


def _start_launch(run_dir, *overrides, sigint_ignored: bool = False):
    """`llmtrain launch` in the background; sigint_ignored: as a script's `llmtrain launch ... &` starts it."""
    argv = [sys.executable, "-m", "llmtrain", "launch", f"run.dir={run_dir}", *overrides]
    if sigint_ignored:
        argv = ["sh", "-c", 'trap "" INT; exec "$@"', "sh", *argv]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _worker_of_rank(run_dir, rank: int):
    for p in worker_processes(run_dir):
        try:
            if "llmtrain.worker" in " ".join(p.cmdline()) and p.environ().get("RANK") == str(rank):
                return p
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return None


def _complete_checkpoints(run_dir: Path) -> list[Path]:
    return sorted(p for p in (run_dir / "checkpoints").glob("step-*")
                  if not p.name.endswith(".tmp") and (p / "meta.json").is_file())


@pytest.fixture(scope="module")
def crashed(tmp_path_factory):
    """A run on a token file, saving by time alone (checkpoint.interval_minutes=0.01, no step interval), whose
    rank 1 is killed (kill -9) once two periodic checkpoints exist."""
    from llmtrain.data import prepare_corpus

    base = tmp_path_factory.mktemp("crashed")
    data = base / "tokens.bin"
    prepare_corpus([str(REPO / "llmtrain")], str(data), include=["*.py"])
    run_dir = base / "run"
    overrides = [*SMALL, "data=memmap", f"data.path={data}", "train.max_steps=100000",
                 "checkpoint.interval_minutes=0.01"]
    proc = _start_launch(run_dir, *overrides)
    try:
        assert wait_for(lambda: len(_complete_checkpoints(run_dir)) >= 2, timeout=180), "no periodic checkpoint"
        victim = _worker_of_rank(run_dir, 1)
        assert victim is not None
        victim.kill()  # SIGKILL: a rank dying without a word
        out, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
    return {"run": run_dir, "data": data, "overrides": overrides, "out": out, "code": proc.returncode}


def test_crashed_rank_is_named_and_its_periodic_checkpoint_resumed(crashed, tmp_path):
    run_dir, out = crashed["run"], crashed["out"]
    assert crashed["code"] not in (0, None)
    assert re.search(r"rank 1 \(node 0, host \S+, local rank 1\) failed", out), out[-2000:]
    lines = out.splitlines()
    named = next(i for i, line in enumerate(lines) if re.search(r"rank 1 \(.*\) failed", line))
    if (run_dir / "logs" / "rank1.log").stat().st_size == 0:  # killed before it wrote a line: others' lines stand in
        assert lines[named + 1].startswith("  (its log is empty; last lines of rank 0's log, "), out[-2000:]
        assert lines[named + 2].startswith("  "), out[-2000:]
    assert wait_for(lambda: not worker_processes(run_dir), timeout=30), worker_processes(run_dir)
    # Saved by time on the way (no step interval was set), and kept through the crash.
    saved = {int(p.name[5:]) for p in _complete_checkpoints(run_dir)}
    assert len(saved) == 2 and 0 < min(saved), saved
    assert sum("saved checkpoint step" in line for line in (run_dir / "logs" / "rank0.log").open()) >= 2
    # The next launch resumes from the newest of them.
    again = tmp_path / "run"
    shutil.copytree(run_dir, again)
    newest = max(saved)
    result = run_cli(["launch", f"run.dir={again}", *crashed["overrides"], f"train.stop_at_step={newest + 2}"])
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert f"resuming from {again / 'checkpoints' / f'step-{newest:07d}'}" in result.stdout.replace("\n", "")
    assert f"at step {newest} " in (again / "logs" / "rank0.log").read_text()
    assert sorted(train_losses(again))[-2:] == [newest + 1, newest + 2]
    # config.yaml keeps the value as written; job.json records what it resolved to, which the workers loaded.
    assert OmegaConf.load(again / "config.yaml").checkpoint.resume == "auto"
    launch_entry = json.loads((again / "job.json").read_text())["launches"][-1]
    assert launch_entry["resume"] == {"value": "auto", "checkpoint": str(again / "checkpoints" / f"step-{newest:07d}"),
                                      "why": f"auto: newest complete checkpoint step-{newest:07d}"}


def _snapshot(run_dir: Path) -> dict:
    return {str(p.relative_to(run_dir)): (p.stat().st_size, p.stat().st_mtime_ns) for p in run_dir.rglob("*")
            if p.is_file()}


def test_replaced_data_is_refused_before_any_worker_and_overwrite_starts_afresh(crashed, tmp_path):
    """A token file and its .json replaced by another consistent pair: the next launch refuses in one line naming
    data.path and what changed (exit 2, nothing written); resumed into another run.dir it goes on, listing the
    change; run.overwrite=true moves the earlier run aside and starts afresh."""
    from llmtrain.data import prepare_corpus

    run_dir, data = tmp_path / "run", tmp_path / "tokens.bin"
    shutil.copytree(crashed["run"], run_dir)
    shutil.copy(crashed["data"], data)  # the same data under another path: the same data
    shutil.copy(str(crashed["data"]) + ".json", str(data) + ".json")
    overrides = [o for o in crashed["overrides"] if not o.startswith("data.path=")] + [f"data.path={data}"]
    prepare_corpus([str(REPO / "tests")], str(data), include=["*.py"])  # another consistent pair
    before = _snapshot(run_dir)
    result = run_cli(["launch", f"run.dir={run_dir}", *overrides, "train.stop_at_step=2"])
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stdout[-2000:] + result.stderr
    assert result.stderr.startswith(f"llmtrain: error: run.dir: other data (data.path {data}: size ")
    assert f"its meta {data}.json changed, its sampled blocks differ" in result.stderr
    assert "would start a new run" in result.stderr and "run.overwrite=true" in result.stderr
    assert _snapshot(run_dir) == before and not worker_processes(run_dir)  # no worker started, nothing written
    # Its weights go on training on the new data when resumed on purpose into another run directory.
    newest = _complete_checkpoints(run_dir)[-1]
    step = int(newest.name[5:])
    elsewhere = tmp_path / "elsewhere"
    result = run_cli(["launch", f"run.dir={elsewhere}", *overrides, f"checkpoint.resume={newest}",
                      f"train.stop_at_step={step + 1}"])
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert f"  data.path: other data than the checkpoint's: {data}: size " in result.stdout
    assert sorted(train_losses(elsewhere)) == [step + 1]
    assert OmegaConf.load(elsewhere / "config.yaml").checkpoint.resume == str(newest)
    result = run_cli(["launch", f"run.dir={run_dir}", *overrides, "train.stop_at_step=2", "run.overwrite=true"])
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "run.overwrite=true: moved the earlier run" in result.stdout
    assert sorted(train_losses(run_dir)) == [1, 2]  # a new run on the new data


@pytest.mark.parametrize("sig,code,said", [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "preempted")])
def test_interrupt_stops_every_process(tmp_path, sig, code, said):
    """Ctrl-C stops at once; SIGTERM (preemption) checkpoints first; either way nothing is left running. The
    launcher starts with SIGINT ignored, as a script's background job does: Ctrl-C must stop it all the same."""
    run_dir = tmp_path / "run"
    proc = _start_launch(run_dir, *SMALL, "train.max_steps=100000", sigint_ignored=sig == signal.SIGINT)
    try:
        assert wait_for(lambda: read_rows(run_dir), timeout=120), "training never started"
        assert len(worker_processes(run_dir)) >= 3  # agent + 2 workers
        proc.send_signal(sig)
        out, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == code, out[-2000:]
    assert said in out
    if sig == signal.SIGINT:
        # The workers checkpoint on their way out; the launcher names that checkpoint.
        saved = re.search(r"checkpoint step (\d+) saved in (\S+); the same command resumes from it", out)
        assert saved, out[-2000:]
        meta = json.loads((Path(saved[2]) / "meta.json").read_text())
        assert meta["complete"] and meta["step"] == int(saved[1])
    assert wait_for(lambda: not worker_processes(run_dir), timeout=30), worker_processes(run_dir)
