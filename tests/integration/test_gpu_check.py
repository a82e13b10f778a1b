"""scripts/gpu_check.sh without a GPU: its default parts fit its deadline, the deadline stops it cleanly (a part past
it is skipped, a running one is stopped), and its CPU dry mode runs every part's logic with tiny models."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import time

import pytest
import yaml
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


def test_the_default_parts_fit_the_deadline_and_the_deadline_an_8_minute_loan():
    m = parts_module()
    assert sum(m.BUDGET_S[p] for p in m.DEFAULT_PARTS) <= m.DEADLINE_S <= 8 * 60 - 90
    assert set(m.BUDGET_S) == set(m.TITLES) and "fp8" not in m.DEFAULT_PARTS  # the long parts are opt-in
    assert "moe" not in m.DEFAULT_PARTS and m.BUDGET_S["moe"] <= 150
    assert "long" not in m.DEFAULT_PARTS and m.BUDGET_S["long"] <= 150
    # What gpu_check.sh runs is what `plan` prints: by default those parts, with those limits.
    plan = subprocess.run(["python3", str(REPO / "scripts" / "gpu_check_parts.py"), "plan"], capture_output=True,
                          text=True, check=True).stdout.splitlines()
    assert plan == ["390", "smoke:60 throughput:150 memory:60 resume:90"]
    deadline, chosen = m.plan(None, True, None, "cuda")
    assert [p for p, _ in chosen] == list(m.BUDGET_S) and deadline >= sum(limit for _, limit in chosen)
    assert m.plan("fp8,smoke:5", False, None, "cpu") == (390 * 3, [("fp8", 330 * 3), ("smoke", 5.0)])
    with pytest.raises(SystemExit, match="unknown part 'fp9' in --parts"):
        m.plan("fp9", False, None, "cuda")


def test_a_part_that_times_out_is_a_fail_row_with_its_log(tmp_path):
    out = tmp_path / "check"
    result = run_check(out, parts="smoke:0.1 fp8:30", timeout=120)
    assert result.returncode == 0, result.stderr
    table, t = rows(out), titles()
    assert set(table) == set(t.values())
    status, figures, log = table[t["smoke"]]
    assert status == "FAIL" and "timed out after 0.1 s" in figures and log == str(out / "logs" / "smoke.log")
    assert os.path.exists(log)
    assert table[t["fp8"]][0] == "SKIP"
    assert table[t["memory"]] == ["NOT RUN", "not asked for (--long or --parts runs it)", ""]


def test_a_part_past_the_deadline_is_skipped_and_named(tmp_path):
    out = tmp_path / "check"
    result = run_check(out, "--parts", "smoke,fp8", "--deadline", "0", timeout=120)
    assert result.returncode == 0, result.stderr
    table, t = rows(out), titles()
    for part in ("smoke", "fp8"):
        assert table[t[part]] == ["SKIP", "not started: past the check's deadline of 0 s", ""], part
    assert table[t["resume"]][0] == "NOT RUN" and (out / "summary.md").read_text() in result.stdout


@pytest.mark.slow
def test_a_running_part_is_stopped_at_the_deadline_and_the_summary_written(tmp_path):
    out = tmp_path / "check"
    start = time.monotonic()
    result = run_check(out, "--parts", "resume,memory", "--deadline", "12", timeout=300)
    took = time.monotonic() - start
    assert result.returncode == 0, result.stderr
    table, t = rows(out), titles()
    status, figures, log = table[t["resume"]]
    if "resume skipped" in result.stdout:  # the script's own start took the whole 12 s on a loaded machine
        assert status == "SKIP"
    else:  # resume's three launches take far longer than 12 s: stopped at the deadline, not at its own limit
        assert status == "TIMEOUT" and figures.startswith("stopped at the check's deadline of 12 s, after running ")
        assert log == str(out / "logs" / "resume.log")
    assert table[t["memory"]] == ["SKIP", "not started: past the check's deadline of 12 s", ""]
    assert took < 12 + 10 + 30, took  # the deadline, the launcher's 10 s to stop, the summary
    runs = list((out / "runs").glob("*"))
    assert wait_for(lambda: not any(worker_processes(run) for run in runs), timeout=30)  # nothing left running


@pytest.fixture(scope="module")
def dry_run_of_every_part(tmp_path_factory):
    """One `--long` dry run on CPU (every part, the tune included), shared by the checks below."""
    out = tmp_path_factory.mktemp("dry") / "check"
    return out, run_check(out, "--long")


@pytest.mark.slow
def test_dry_mode_runs_every_part_on_cpu(dry_run_of_every_part):
    out, result = dry_run_of_every_part
    assert result.returncode == 0, result.stderr
    assert (out / "summary.md").read_text() in result.stdout
    table, t = rows(out), titles()
    assert set(table) == set(t.values())
    skipped = {t["apex"], t["fp8"]}  # apex needs CUDA; fp8 is a placeholder
    for title, (status, figures, log) in table.items():
        assert status == ("SKIP" if title in skipped else "PASS"), (title, status, figures, open(log).read()[-3000:])
    # A CPU has no known peak: the parts that report MFU say it is not shown, never a made-up figure.
    for part in ("throughput", "llama", "tune", "moe", "long"):
        figures = table[t[part]][1]
        assert "MFU not shown (no known peak)" in figures and "nan" not in figures, (part, figures)


@pytest.mark.slow
def test_dry_mode_tune_part_reports_the_winner_against_the_defaults(dry_run_of_every_part):
    out, result = dry_run_of_every_part
    assert result.returncode == 0, result.stderr
    status, figures, log = rows(out)[titles()["tune"]]
    assert status == "PASS", (figures, open(log).read()[-3000:])
    assert figures.startswith("winner dp1-tp1-pp1-") and "; defaults (micro 2): " in figures
    assert "calibrated from 3 trials on cpu, " in figures
    assert len(list((out / "runs" / "tune" / "trials").glob("*.json"))) == 3


@pytest.mark.slow
def test_dry_mode_moe_part_runs_the_grouped_kernel_and_the_loop(dry_run_of_every_part):
    out, result = dry_run_of_every_part
    assert result.returncode == 0, result.stderr
    status, figures, log = rows(out)[titles()["moe"]]
    assert status == "PASS", (figures, open(log).read()[-3000:])
    speed = r"[\d,]+ tok/s, MFU not shown \(no known peak\)"
    assert re.fullmatch(rf"moe-tiny x 2 layers, micro 2: grouped {speed}; loop {speed}; grouped / loop [\d.]+x; "
                        r"step-1 losses [\d.e+-]+ apart \(pass <= 0.01\); losses fell over 10 steps", figures), figures
    for mode in ("on", "off"):  # each run got its setting
        config = yaml.safe_load((out / "runs" / f"moe-grouped-{mode}" / "config.yaml").read_text())
        assert config["model"]["moe"]["grouped_mm"] == mode


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


@pytest.mark.slow
def test_dry_mode_long_part_runs_the_plans_layout(dry_run_of_every_part):
    out, result = dry_run_of_every_part
    assert result.returncode == 0, result.stderr
    status, figures, log = rows(out)[titles()["long"]]
    assert status == "PASS", (figures, open(log).read()[-3000:])
    m = re.fullmatch(r"llama-tiny x 2 layers seq 256, the plan's layout for \d+ GiB: train.micro_batch_size=(\d) "
                     r"recompute=(\w+) parallel.zero=(\d): [\d,]+ tok/s \(plan [\d,]+\), MFU not shown \(no known "
                     r"peak\); peak [\d.]+ MiB measured, plan [\d.]+ MiB \([\d.]+x; pass within 10%\); 10 of 10 steps",
                     figures)
    assert m, figures
    config = yaml.safe_load((out / "runs" / "long" / "config.yaml").read_text())  # the run got the plan's layout
    assert (config["train"]["micro_batch_size"], config["recompute"]["mode"], config["parallel"]["zero"]) == \
        (int(m[1]), m[2], int(m[3]))
    assert config["model"]["seq_len"] == 256 and config["train"]["global_batch_size"] == 4


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
