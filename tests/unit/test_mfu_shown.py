"""MFU only against a known peak (a GPU profile's, or one given with hardware.peak_tflops.<dtype>), never over 100%,
and the same rule in every printer: the trainer's log line and metrics row, the launcher's progress line, `status`,
`report`, `compare` and the tune table. Without a peak: no MFU field or column, and one line saying why. Rows of
older runs carry an `mfu` without the peak it was measured against: shown as that line too."""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace

from helpers.fake_run import make_run
from helpers.job_records import OK, cli, launch_entry
from helpers.sweep_tables import table_rows
from rich.console import Console

from llmtrain.rundir.metrics_file import read_metrics
from llmtrain.rundir.mfu_field import not_shown_line, shown_mfu

NO_PEAK = ("MFU not shown: no known peak for this run's device (a CPU, or a GPU without a hardware profile); give "
           "one with +hardware.peak_tflops.float32=<TFLOPS> to show it")
UNRECORDED = ("MFU not shown: these metrics do not record the peak their MFU was measured against (written by an "
              "older llmtrain)")


# ---- the trainer's row and line -----------------------------------------------------------------------------------

def _logged(tmp_path, monkeypatch, peak_flops):
    """Two logged steps of 256 tokens, each 1 s after the last (a fake clock), at 1e10 FLOPs per token on one
    device: 2.56 TFLOPS. (the rows, the console lines)."""
    from llmtrain.train import step_log
    from llmtrain.train.metrics import MetricsWriter

    clock = iter(range(100))
    monkeypatch.setattr(step_log, "time", SimpleNamespace(perf_counter=lambda: float(next(clock))))
    feed = SimpleNamespace(take_wait_ms=lambda: 0.0, source_tokens=lambda samples: None)
    train_cfg = SimpleNamespace(log_interval=1, max_steps=2, warmup_steps=1, lr=1e-3, min_lr=1e-4)
    metrics = MetricsWriter(str(tmp_path / "metrics.jsonl"))
    lines = []
    log = step_log.StepLog(train_cfg, metrics, lambda line, **_: lines.append(line), 256, 1e10, peak_flops, 1,
                           SimpleNamespace(enabled=False), lambda: 0.5, feed,
                           peak_key="hardware.peak_tflops.float32")
    for step in (1, 2):
        log.step_done(step, SimpleNamespace(loss=2.0, grad_norm=1.0, moe=None), 0.1, 256 * step, 1.0 * step, 4 * step)
    metrics.close()
    return read_metrics(str(tmp_path / "metrics.jsonl")), lines


def test_without_a_peak_the_row_and_line_have_no_mfu(tmp_path, monkeypatch):
    rows, lines = _logged(tmp_path, monkeypatch, None)
    assert [(r["tflops"], "mfu" in r, "peak_tflops" in r) for r in rows] == [(2.56, False, False)] * 2
    assert lines == ["step      1/2 | loss 2.0000 | lr 1.00e-03 | grad_norm 1.000 | 256 tok/s | 100 ms/step",
                     "step      2/2 | loss 2.0000 | lr 1.00e-03 | grad_norm 1.000 | 256 tok/s | 100 ms/step"]


def test_with_a_peak_the_row_records_mfu_and_the_peak(tmp_path, monkeypatch):
    rows, lines = _logged(tmp_path, monkeypatch, 10e12)
    assert [(r["mfu"], r["peak_tflops"]) for r in rows] == [(0.256, 10.0)] * 2
    assert all(line.endswith(" | 256 tok/s | 100 ms/step | MFU 25.6%") for line in lines)


def test_a_step_above_the_given_peak_says_the_peak_is_wrong_once(tmp_path, monkeypatch):
    rows, lines = _logged(tmp_path, monkeypatch, 2e12)  # 2.56 TFLOPS measured: 128%
    assert lines[0] == ("llmtrain: warning: step 1 ran 2.56 TFLOPS per device, above the peak of 2 TFLOPS "
                        "(hardware.peak_tflops.float32): that peak is wrong; MFU is not shown for the rest of this run")
    assert len(lines) == 3 and not any("MFU" in line for line in lines[1:])
    assert not any("mfu" in r for r in rows)


# ---- readers ------------------------------------------------------------------------------------------------------

def test_a_rows_mfu_is_shown_only_against_a_recorded_peak_and_at_most_100_percent():
    assert shown_mfu({"mfu": 0.25, "peak_tflops": 989.0}) == 0.25
    assert shown_mfu({"mfu": 1.0, "peak_tflops": 989.0}) == 1.0
    assert shown_mfu({"mfu": 1.202, "peak_tflops": 989.0}) is None
    assert shown_mfu({"mfu": 0.844}) is None  # an older run's: against a CPU peak measured at start-up
    assert shown_mfu({"mfu": None, "peak_tflops": 1.0}) is None and shown_mfu({}) is None
    assert not_shown_line([{"loss": 1.0}], "float32") == NO_PEAK
    assert not_shown_line([{"loss": 1.0, "mfu": 1.202}], "float32") == UNRECORDED


def test_the_progress_line_shows_mfu_only_when_the_row_has_one_to_show():
    from llmtrain.launch.supervision.monitor import progress_mfu

    assert progress_mfu({"mfu": 0.454, "peak_tflops": 989.0}) == "MFU 45.4%"
    assert progress_mfu({"mfu": 1.102}) == ""
    assert progress_mfu({"mfu": 1.102, "peak_tflops": 0.02}) == ""
    assert progress_mfu({"loss": 4.0}) == ""


def _rows(run_dir, **fields):
    rows = [{"step": s, "loss": 5.0 - s / 4, "tokens_per_s": 1000.0 + s, "elapsed_s": 2.5 * s, **fields}
            for s in range(1, 5)]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def _status(capsys, run_dir):
    code, out, err = cli(capsys, "status", str(run_dir))
    assert code == 0 and not err
    lines = out.splitlines()
    code, out, _ = cli(capsys, "status", str(run_dir), "--json")
    return lines, json.loads(out)


def test_status_shows_mfu_or_one_line_why(tmp_path, capsys):
    run_dir = make_run(tmp_path, statuses={0: OK}, launches=[launch_entry()])
    lines, facts = _status(capsys, run_dir)  # make_run's rows: MFU 12.5% against a recorded peak
    assert "last row    step 4: loss 4.0000 | 1,004 tok/s | MFU 12.5%" in lines
    assert (facts["mfu"], facts["mfu_note"]) == (0.125, None) and not any(ln.startswith("MFU") for ln in lines)
    _rows(run_dir)
    lines, facts = _status(capsys, run_dir)
    assert "last row    step 4: loss 4.0000 | 1,004 tok/s" in lines and f"MFU         {NO_PEAK[4:]}" in lines
    assert (facts["mfu"], facts["mfu_note"]) == (None, NO_PEAK[4:])
    _rows(run_dir, mfu=1.202)  # an older run's row
    lines, facts = _status(capsys, run_dir)
    assert "last row    step 4: loss 4.0000 | 1,004 tok/s" in lines and f"MFU         {UNRECORDED[4:]}" in lines
    assert facts["mfu"] is None and not any("120.2%" in ln for ln in lines)


def test_report_shows_the_median_mfu_or_one_line_why(tmp_path, capsys, monkeypatch):
    from llmtrain.cli import main

    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # the table only
    run_dir = make_run(tmp_path)
    _rows(run_dir, mfu=0.3, peak_tflops=8.0)
    assert main(["report", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert any(ln.startswith("│ MFU (median)") and ln.rstrip("│ ").endswith("30.0%") for ln in out.splitlines())
    assert "MFU not shown" not in out
    for fields, line in (({}, NO_PEAK), ({"mfu": 0.844}, UNRECORDED)):
        _rows(run_dir, **fields)
        assert main(["report", str(run_dir)]) == 0
        out = capsys.readouterr().out
        assert "MFU (median)" not in out and "84.4%" not in out
        assert out.splitlines().count(line) == 1


def test_the_reports_tensorboard_export_leaves_an_unshown_mfu_out(tmp_path, capsys):
    from llmtrain.report.run_report import export_tensorboard

    run_dir = make_run(tmp_path)
    _rows(run_dir, mfu=1.202)
    path, _ = export_tensorboard(read_metrics(str(run_dir / "metrics.jsonl")), str(tmp_path / "tb"),
                                 str(run_dir / "metrics.jsonl"))
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(path)
    events.Reload()
    assert "train/loss" in events.Tags()["scalars"] and "train/mfu" not in events.Tags()["scalars"]


def test_compare_has_an_mfu_column_only_when_a_run_shows_mfu(tmp_path, capsys, monkeypatch):
    from llmtrain.cli import main

    monkeypatch.chdir(tmp_path)  # compare writes its plot into the current folder

    a, b = make_run(tmp_path / "a"), make_run(tmp_path / "b")
    _rows(a, mfu=0.3, peak_tflops=8.0)
    _rows(b, mfu=0.844)
    assert main(["compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    header = next(ln for ln in out.splitlines() if ln.startswith("┃"))
    assert [h.strip() for h in header.strip("┃").split("┃")][-2:] == ["MFU", "steps"]
    assert [row[-2] for row in table_rows(out)[:2]] == ["30.0%", "-"]
    assert UNRECORDED.replace("not shown", "not shown for run", 1) in out.splitlines()
    _rows(a)
    _rows(b)
    assert main(["compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    header = next(ln for ln in out.splitlines() if ln.startswith("┃"))
    assert "MFU" not in header and out.splitlines().count(NO_PEAK) == 1


def test_the_tune_table_has_an_mfu_column_only_when_a_trial_shows_mfu():
    from llmtrain.tune import table
    from llmtrain.tune.trials import Trial

    def trial(name, mfu=None, peak=None):
        return Trial(name, [], 1000.0, None, 1.0, 1.0, 0.0, tokens_per_s=900.0, mfu=mfu, mfu_peak_tflops=peak,
                     peak_gib=0.5)

    def render(trials):
        console = Console(record=True, width=200)
        table.render(trials, "tune", console, "float32")
        return console.export_text()

    out = render([trial("a"), trial("b")])
    header = next(ln for ln in out.splitlines() if ln.startswith("┃"))
    assert "tokens/s" in header and "MFU" not in header and out.splitlines().count(NO_PEAK) == 1
    out = render([trial("a", 0.4680), trial("b", 0.1009)])  # recorded by an older tune: no peak
    assert "46.80%" not in out and out.splitlines().count(UNRECORDED) == 1
    out = render([trial("a", 0.4680, 1.0), trial("b", 0.1009, 1.0)])
    assert [row[3] for row in table_rows(out)] == ["46.80%", "10.09%"] and "MFU not shown" not in out
