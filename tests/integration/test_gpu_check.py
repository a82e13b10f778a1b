"""scripts/gpu_check.sh without a GPU: a part's limit and the check's deadline stop it cleanly and at once (a part
past the deadline is skipped, a running one is stopped without a checkpoint), and its CPU dry mode runs a real part
end to end. Each part's logic: tests/unit/test_gpu_check_parts.py; the plan: tests/unit/test_gpu_check_plan.py."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import time

import psutil
import pytest
from conftest import REPO, wait_for, worker_processes


def parts_module():
    spec = importlib.util.spec_from_file_location("gpu_check_parts", REPO / "scripts" / "gpu_check_parts.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def titles() -> dict:
    return parts_module().TITLES


def run_check(out, *args: str, parts: str | None = None, timeout: float = 900) -> subprocess.CompletedProcess:
    # The script runs `python3`: the one this suite runs under, with llmtrain's dependencies, as on a GPU machine.
    path = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
    env = dict(os.environ, PATH=path, **({"GPU_CHECK_PARTS": parts} if parts else {}))
    return subprocess.run(["bash", str(REPO / "scripts" / "gpu_check.sh"), "--cpu", *args, str(out)], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=timeout)


def rows(out) -> dict[str, list[str]]:
    """summary.md's rows by part title: [status, figures, log]."""
    table = {}
    for line in (out / "summary.md").read_text().splitlines()[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        table[cells[0]] = cells[1:]
    return table


def test_a_part_that_times_out_is_a_fail_row_with_its_log(tmp_path):
    out = tmp_path / "check"
    result = run_check(out, parts="smoke:0.1 fp8:30", timeout=120)
    assert result.returncode == 0, result.stderr
    table, t = rows(out), titles()
    assert set(table) == set(t.values())
    status, figures, log = table[t["smoke"]]
    assert status == "FAIL" and figures == "timed out after 0.1 s (stopped at once, no checkpoint)"
    assert log == str(out / "logs" / "smoke.log") and "smoke reached its limit of 0.1 s" in open(log).read()
    assert table[t["fp8"]][0] == "SKIP"
    assert table[t["memory"]] == ["NOT RUN", "not asked for (the default run runs it)", ""]
    assert table[t["llama"]] == ["NOT RUN", "not asked for (--long 1 runs it)", ""]
    assert table[t["apex"]] == ["NOT RUN", "not asked for (--parts apex runs it)", ""]


def test_a_part_past_the_deadline_is_skipped_and_named(tmp_path):
    out = tmp_path / "check"
    result = run_check(out, "--parts", "smoke,fp8", "--deadline", "0", timeout=120)
    assert result.returncode == 0, result.stderr
    table, t = rows(out), titles()
    for part in ("smoke", "fp8"):
        assert table[t[part]] == ["SKIP", "not started: past the check's deadline of 0 s", ""], part
    assert table[t["resume"]][0] == "NOT RUN" and (out / "summary.md").read_text() in result.stdout


def test_a_running_part_is_stopped_at_the_deadline_and_the_summary_written(tmp_path):
    out = tmp_path / "check"
    start = time.monotonic()
    result = run_check(out, "--parts", "smoke,memory", "--deadline", "4", timeout=120)
    took = time.monotonic() - start
    assert result.returncode == 0, result.stderr
    table, t = rows(out), titles()
    status, figures, log = table[t["smoke"]]
    if "smoke skipped" in result.stdout:  # the script's own start took the whole 4 s on a loaded machine
        assert status == "SKIP"
    else:  # smoke's launch takes far longer than 4 s: stopped at the deadline, not at its own limit
        assert status == "TIMEOUT", (figures, open(log).read()[-2000:])
        assert re.fullmatch(r"stopped at the check's deadline of 4 s, after running [\d.]+ s \(no checkpoint\)",
                            figures), figures
        assert log == str(out / "logs" / "smoke.log")
    assert table[t["memory"]] == ["SKIP", "not started: past the check's deadline of 4 s", ""]
    assert took < 4 + 10, took  # no grace for a checkpoint: the deadline, the kill, the summary
    assert not any(worker_processes(run) for run in (out / "runs").glob("*"))  # nothing left running


@pytest.mark.slow
def test_dry_mode_runs_a_real_part_end_to_end(tmp_path):
    """One real launch through the whole script (the parts' logic is tested with stand-in launches in
    tests/unit/test_gpu_check_parts.py)."""
    out = tmp_path / "check"
    result = run_check(out, "--parts", "smoke,apex", timeout=300)
    assert result.returncode == 0, result.stderr
    assert (out / "summary.md").read_text() in result.stdout
    table, t = rows(out), titles()
    status, figures, log = table[t["smoke"]]
    assert status == "PASS", (figures, open(log).read()[-3000:])
    assert re.fullmatch(r"6 steps, loss [\d.]+ -> [\d.]+", figures), figures
    assert table[t["apex"]][:2] == ["SKIP", "apex needs CUDA"]


def launched_for(run) -> list[psutil.Process]:
    """The launcher, agent, torchrun and workers of a run (each names the run's directory)."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        if any(str(run) in arg for arg in p.info["cmdline"] or []) and p.pid != os.getpid():
            found.append(p)
    return found


STOPPED_PART = """
import sys, threading, time
from pathlib import Path
scripts, out, limit = sys.argv[1], Path(sys.argv[2]), float(sys.argv[3])
sys.path.insert(0, scripts)
import gpu_check_parts as g
from gpu_check_stop import arm

metrics = out / "runs" / "endless" / "metrics.jsonl"


def endless(p):  # trains until stopped, and would checkpoint at the end or on a preemption signal
    p.launch("endless", [*p.sizes.tiny, "train.max_steps=100000", "checkpoint.at_end=true",
                         "checkpoint.interval_minutes=0"])
    return "PASS", "finished"


def limit_once_training():  # the limit falls while the workers train, as a part's limit does on a GPU
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 2):
        time.sleep(0.1)
    print(f"limit armed at {time.time()}", flush=True)
    arm(limit, "endless")


g.PARTS["smoke"] = endless
threading.Thread(target=limit_once_training, daemon=True).start()
sys.argv = [sys.argv[0], "smoke", "--out", str(out), "--device", "cpu"]
sys.exit(g.main())
"""


@pytest.mark.slow
def test_a_part_stopped_at_its_limit_saves_no_checkpoint_and_ends_at_once(tmp_path):
    driver = tmp_path / "stopped_part.py"
    driver.write_text(STOPPED_PART)
    out = tmp_path / "check"
    run = out / "runs" / "endless"
    try:
        proc = subprocess.run([sys.executable, str(driver), str(REPO / "scripts"), str(out), "0.5"], cwd=REPO,
                              capture_output=True, text=True, timeout=240)
    finally:  # a stop that failed leaves an endless run behind: end it
        for leftover in launched_for(run):
            leftover.kill()
    ended = time.time()
    assert proc.returncode == 124, proc.stdout[-3000:] + proc.stderr[-3000:]
    armed = float(re.search(r"limit armed at ([\d.]+)", proc.stdout)[1])
    assert ended - armed < 0.5 + 5, ended - armed  # a few seconds, not a checkpoint's grace
    assert "endless reached its limit of 0.5 s: stopping at once" in proc.stdout
    assert len((run / "metrics.jsonl").read_text().splitlines()) >= 2  # it was stopped while training
    assert list(run.glob("checkpoints/*")) == [], list(run.glob("checkpoints/*"))
    assert "preemption signal received" not in "".join(f.read_text() for f in run.glob("logs/*.log"))
    assert not (out / "results" / "smoke.json").exists()  # no row: gpu_check.sh records the timeout
    assert wait_for(lambda: not launched_for(run), timeout=10)


def _moe_part(tmp_path, monkeypatch, losses: dict):
    """gpu_check_moe.part_moe on the CPU sizes with launches that write `losses[mode]` as metrics.jsonl (a None
    entry: that launch fails)."""
    monkeypatch.syspath_prepend(str(REPO / "scripts"))
    parts = parts_module()
    monkeypatch.setitem(sys.modules, "gpu_check_parts", parts)
    from gpu_check_moe import part_moe

    def launch(name, overrides, fresh=True):
        mode = next(o.rpartition("=")[2] for o in overrides if "grouped_mm" in o)
        if losses[mode] is None:
            raise RuntimeError(f"llmtrain launch {name} failed (exit 1)")
        run = tmp_path / "runs" / name
        run.mkdir(parents=True)
        tps = 1000.0 if mode == "on" else 250.0
        (run / "metrics.jsonl").write_text("".join(
            json.dumps({"step": i + 1, "loss": v, "tokens_per_s": tps, "step_time_s": 0.1}) + "\n"
            for i, v in enumerate(losses[mode])))
        return run

    p = parts.Part(tmp_path, parts.Sizes("cpu"))
    monkeypatch.setattr(p, "launch", launch)
    return part_moe, p


FALLING = [5.0 - 0.1 * i for i in range(10)]


def test_moe_part_passes_on_agreeing_falling_losses(tmp_path, monkeypatch):
    part_moe, p = _moe_part(tmp_path, monkeypatch, {"on": FALLING, "off": FALLING})
    assert part_moe(p) == ("PASS", "moe-tiny x 2 layers, micro 2: grouped 1,000 tok/s, MFU not shown (no known peak); "
                                   "loop 250 tok/s, MFU not shown (no known peak); grouped / loop 4.000x; step-1 "
                                   "losses 0.0e+00 apart (pass <= 0.01); losses fell over 10 steps")


@pytest.mark.parametrize("off, words", [([5.1] + FALLING[1:], "step-1 losses 2.0e-02 apart (pass <= 0.01); losses fell"),
                                        ([5.0] * 10, "losses did not fall over 10 steps")])
def test_moe_part_fails_on_disagreeing_or_flat_losses(tmp_path, monkeypatch, off, words):
    part_moe, p = _moe_part(tmp_path, monkeypatch, {"on": FALLING, "off": off})
    status, figures = part_moe(p)
    assert status == "FAIL" and words in figures, figures


def test_moe_part_keeps_the_grouped_figures_when_the_loop_run_does_not_finish(tmp_path, monkeypatch):
    part_moe, p = _moe_part(tmp_path, monkeypatch, {"on": FALLING, "off": None})
    with pytest.raises(RuntimeError, match="moe-grouped-off failed"):
        part_moe(p)
    row = json.loads((tmp_path / "results" / "moe.json").read_text())
    assert row["status"] == "FAIL" and row["log"] == str(tmp_path / "logs" / "moe.log")
    assert row["detail"] == ("moe-tiny x 2 layers: grouped 1,000 tok/s, MFU not shown (no known peak); the loop run "
                             "did not finish")


PLAN = {"dims": {"micro_batch_size": 2, "recompute": "selective", "zero": 0}, "tokens_per_s": 54789.2,
        "peak_bytes_per_rank": 50 * 2**30}


def _long_part(tmp_path, monkeypatch, plans: list[dict], peak: int | None, losses: list[float]):
    """gpu_check_long.part_long on the GPU sizes with the planner's answer `plans` and a launch that writes
    `losses` as metrics.jsonl and `peak` as the status file's peak (no GPU: the device's memory is given)."""
    monkeypatch.syspath_prepend(str(REPO / "scripts"))
    parts = parts_module()
    monkeypatch.setitem(sys.modules, "gpu_check_parts", parts)
    monkeypatch.delitem(sys.modules, "gpu_check_long", raising=False)
    import gpu_check_long

    asked, launched = [], []
    monkeypatch.setattr(gpu_check_long, "device_memory_gib", lambda device: 139.8)
    monkeypatch.setattr(gpu_check_long, "suggest_plans", lambda overrides, gib: asked.append((overrides, gib)) or plans)

    def launch(name, overrides, fresh=True):
        launched.append((name, overrides))
        run = tmp_path / "runs" / name
        (run / "logs").mkdir(parents=True)
        (run / "metrics.jsonl").write_text("".join(
            json.dumps({"step": i + 1, "loss": v, "tokens_per_s": 40000.0 + 10 * i, "step_time_s": 1.6}) + "\n"
            for i, v in enumerate(losses)))
        (run / "logs" / "rank0.status").write_text(json.dumps({"state_bytes": {"peak": peak}}))
        return run

    p = parts.Part(tmp_path, parts.Sizes("cuda"))
    monkeypatch.setattr(p, "launch", launch)
    return gpu_check_long.part_long, p, asked, launched


def test_long_part_launches_the_plans_layout_and_passes_on_a_matching_peak(tmp_path, monkeypatch):
    part_long, p, asked, launched = _long_part(tmp_path, monkeypatch, [PLAN], 48 * 2**30, [5.0 - 0.1 * i
                                                                                            for i in range(10)])
    assert part_long(p) == ("PASS", "llama3-1b seq 8192, the plan's layout for 139 GiB: train.micro_batch_size=2 "
                                    "recompute=selective parallel.zero=0: 40,065 tok/s (plan 54,789), MFU not shown "
                                    "(no known peak); peak 48.00 GiB measured, plan 50.00 GiB (1.042x; pass within "
                                    "10%); 10 of 10 steps")
    (overrides, gib), = asked
    assert gib == 139.8 and overrides[:5] == ["model=llama3-1b", "model.seq_len=8192", "precision=bf16",
                                              "train.micro_batch_size=4", "train.global_batch_size=8"]
    (name, run), = launched  # the plan's micro-batch, recompute and ZeRO level, the same global batch
    assert name == "long" and run[3:8] == ["train.global_batch_size=8", "train.micro_batch_size=2",
                                           "recompute=selective", "parallel.zero=0", "train.max_steps=10"]


@pytest.mark.parametrize("plans, peak, losses, words", [
    ([PLAN], 40 * 2**30, [5.0] * 10, "peak 40.00 GiB measured, plan 50.00 GiB (1.250x; pass within 10%)"),
    ([PLAN], 50 * 2**30, [5.0] * 9 + [float("nan")], "10 of 10 steps, a loss not finite"),
    ([PLAN], 50 * 2**30, [5.0] * 7, "7 of 10 steps"),
    ([PLAN], None, [5.0] * 10, "no measured peak"),
    ([], 50 * 2**30, [5.0] * 10, "llama3-1b seq 8192: `llmtrain plan --suggest 1 139` finds no layout that fits")])
def test_long_part_fails_on_a_peak_off_the_plan_a_lost_step_or_no_plan(tmp_path, monkeypatch, plans, peak, losses,
                                                                       words):
    part_long, p, _, launched = _long_part(tmp_path, monkeypatch, plans, peak, losses)
    status, figures = part_long(p)
    assert status == "FAIL" and words in figures, figures
    assert len(launched) == (1 if plans else 0)
