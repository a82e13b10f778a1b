"""Local sweeps end to end: every combination run, resumed and compared; a failed run; Ctrl-C; a value added to a finished sweep."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest
import yaml
from conftest import read_rows, run_cli, wait_for, worker_processes
from helpers.sweep_tables import PNG_MAGIC, table_rows  # noqa: F401

from llmtrain.report.run_report import fmt_loss


# The tiny model, one process, 3 steps with a val loss at the last one.
TINY = ["model.d_model=64", "model.seq_len=64", "cluster.nproc_per_node=1", "train.max_steps=3",
        "train.log_interval=1", "train.warmup_steps=1", "train.eval_interval=3", "train.eval_steps=1",
        "launch.pg_timeout_s=120"]


@pytest.mark.slow
def test_local_sweep_runs_every_combination_resumes_and_compares(tmp_path):
    sweep = tmp_path / "sweep"
    args = ["launch", "-m", f"run.dir={sweep}", *TINY, "train.lr=1e-3,3e-3", "train.seed=1,2"]
    result = run_cli(args)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "sweep sweep: 4 run(s): 4 finished" in result.stdout

    index = yaml.safe_load((sweep / "sweep.yaml").read_text())
    assert index["swept"] == ["train.lr", "train.seed"]
    runs = index["runs"]
    assert [(r["index"], r["dir"], r["params"]) for r in runs] == [
        (0, "lr=0.001,seed=1", {"train.lr": "0.001", "train.seed": "1"}),
        (1, "lr=0.001,seed=2", {"train.lr": "0.001", "train.seed": "2"}),
        (2, "lr=0.003,seed=1", {"train.lr": "0.003", "train.seed": "1"}),
        (3, "lr=0.003,seed=2", {"train.lr": "0.003", "train.seed": "2"})]
    metrics = {}
    for r in runs:
        run_dir = sweep / r["dir"]
        cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
        assert (cfg["train"]["lr"], cfg["train"]["seed"]) == (float(r["params"]["train.lr"]),
                                                              int(r["params"]["train.seed"]))
        assert cfg["run"]["dir"] == str(run_dir) and cfg["env"]["LLMTRAIN_SWEEP_NAME"] == "sweep"
        metrics[r["dir"]] = (run_dir / "metrics.jsonl").read_bytes()
        assert [row["step"] for row in read_rows(run_dir) if "loss" in row] == [1, 2, 3]

    # The same command again: every run finished, so each is skipped with a line and nothing is written.
    again = run_cli(args)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    for r in runs:
        assert f"llmtrain: sweep: skipping {r['dir']}: finished (step 3 of 3)" in again.stdout, again.stdout
        assert (sweep / r["dir"] / "metrics.jsonl").read_bytes() == metrics[r["dir"]]
        assert len(json.loads((sweep / r["dir"] / "job.json").read_text())["launches"]) == 1
    assert "torch.distributed.run" not in again.stdout and "4 finished (4 skipped: finished before)" in again.stdout

    compared = run_cli(["compare", str(sweep)], cwd=tmp_path)  # its plot goes into the current folder
    assert compared.returncode == 0, compared.stderr
    rows = table_rows(compared.stdout)
    expected = []
    for r in runs:
        rows_of_run = read_rows(sweep / r["dir"])
        best_val = min(row["val_loss"] for row in rows_of_run if "val_loss" in row)
        final = [row["loss"] for row in rows_of_run if "loss" in row][-1]
        expected.append((best_val, [r["dir"], r["params"]["train.lr"], r["params"]["train.seed"], fmt_loss(final),
                                    fmt_loss(best_val)]))
    assert [row[:5] for row in rows] == [cells for _, cells in sorted(expected, key=lambda e: e[0])]
    assert all(row[-1] == "3/3" for row in rows)
    assert (tmp_path / "compare.png").read_bytes()[:8] == PNG_MAGIC and not (sweep / "compare.png").exists()


@pytest.mark.slow
def test_a_failed_run_is_reported_and_the_sweep_goes_on_unless_fail_fast(tmp_path):
    sweep = tmp_path / "sweep"
    # A non-finite step 2 on rank 0: with max_bad_steps=1 the run stops there (fails), with 5 it skips the step.
    args = ["launch", "-m", f"run.dir={sweep}", *TINY, "train.eval_interval=0", "train.max_bad_steps=1,5"]
    env = {"LLMTRAIN_INJECT_NONFINITE": "2:0"}
    fast = run_cli([*args, "--fail-fast"], env=env)
    assert fast.returncode == 1
    assert "stopping the sweep (--fail-fast)" in fast.stdout
    assert "1 failed: max_bad_steps=1 (exit 1); 1 not started: max_bad_steps=5" in fast.stdout
    assert not (sweep / "max_bad_steps=5").exists()
    on = run_cli(args, env=env)
    assert on.returncode == 1
    assert "run max_bad_steps=1 failed (exit 1); going on with the next run" in on.stdout
    assert "2 run(s): 1 finished; 1 failed: max_bad_steps=1 (exit 1)" in on.stdout
    assert [r["step"] for r in read_rows(sweep / "max_bad_steps=5") if "loss" in r] == [1, 2, 3]


@pytest.mark.slow
def test_ctrl_c_stops_the_run_the_usual_way_then_the_sweep(tmp_path):
    sweep = tmp_path / "sweep"
    proc = subprocess.Popen([sys.executable, "-m", "llmtrain", "launch", "-m", f"run.dir={sweep}", *TINY,
                             "train.eval_interval=0", "train.max_steps=100000,3"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    first = sweep / "max_steps=100000"
    try:
        assert wait_for(lambda: read_rows(first), timeout=120), "training never started"
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, out[-3000:]
    assert "the same command resumes from it" in out  # the run's own Ctrl-C path: it checkpointed
    assert "1 not started: max_steps=3; stopped by Ctrl-C in max_steps=100000" in out, out[-2000:]
    assert not (sweep / "max_steps=3").exists()
    assert wait_for(lambda: not worker_processes(first), timeout=30)


@pytest.mark.slow
def test_a_value_added_to_a_finished_sweep_runs_only_the_new_combination(tmp_path):
    sweep = tmp_path / "sweep"
    base = ["launch", "-m", f"run.dir={sweep}", *TINY, "train.eval_interval=0"]
    first = run_cli([*base, "train.lr=1e-3,3e-3"])
    assert first.returncode == 0 and "2 run(s): 2 finished" in first.stdout, first.stdout[-3000:] + first.stderr
    metrics = {name: (sweep / name / "metrics.jsonl").read_bytes() for name in ("lr=0.001", "lr=0.003")}
    more = run_cli([*base, "train.lr=3e-4,1e-3,3e-3"])
    assert more.returncode == 0, more.stdout[-3000:] + more.stderr[-3000:]
    for name in metrics:
        assert f"llmtrain: sweep: skipping {name}: finished (step 3 of 3)" in more.stdout, more.stdout
        assert (sweep / name / "metrics.jsonl").read_bytes() == metrics[name]
    assert "sweep: run 1/3: lr=0.0003" in more.stdout and "3 run(s): 3 finished (2 skipped: finished before)" in \
        more.stdout, more.stdout
    assert [r["step"] for r in read_rows(sweep / "lr=0.0003") if "loss" in r] == [1, 2, 3]
    assert sorted(p.name for p in sweep.iterdir() if p.is_dir()) == ["lr=0.0003", "lr=0.001", "lr=0.003"]
    assert [r["dir"] for r in yaml.safe_load((sweep / "sweep.yaml").read_text())["runs"]] == [
        "lr=0.001", "lr=0.003", "lr=0.0003"]
