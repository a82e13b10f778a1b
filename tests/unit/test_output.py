"""Output written to a file or pipe is never cut or re-wrapped; in a terminal, tables fit and fold."""

from __future__ import annotations

import io
import json

from conftest import run_cli

from llmtrain.console import fold_table, get_console
from llmtrain.launch.supervision.failures import report_failure
from llmtrain.launch.supervision.monitor import Monitor

STAGE_COLUMNS = ["stage", "layers", "params", "params/rank", "weights", "grads", "optimizer", "gathered",
                 "activations", "in flight", "rank peak"]
LONG_LINE = "x" * 120 + " Traceback line with words " + "/very/long/module/path" * 7 + " end"


def test_plan_to_a_file_is_not_cut():
    result = run_cli(["plan", "model=gpt-1.3b", "parallel.tp=2", "parallel.pp=2", "precision=bf16",
                      "cluster.nproc_per_node=8", "hardware=h100"], timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "…" not in result.stdout
    header = [line for line in result.stdout.splitlines() if line.startswith("┃")]
    assert len(header) == 1, result.stdout
    assert [cell.strip() for cell in header[0].strip("┃").split("┃")] == STAGE_COLUMNS


def test_ckpt_list_prints_a_deep_checkpoint_path_whole(tmp_path):
    run_dir = tmp_path / "runs" / ("a-rather-long-experiment-name-" * 3) / "seed-0000"
    ckpt = run_dir / "checkpoints" / "step-0000002"
    ckpt.mkdir(parents=True)
    (ckpt / "meta.json").write_text(json.dumps({"step": 2, "files": {},
                                                "layout": {"dp": 1, "tp": 1, "pp": 1, "zero": 0, "world_size": 1}}))
    assert len(str(ckpt)) > 100
    result = run_cli(["ckpt", "list", str(run_dir)], timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "…" not in result.stdout
    assert any(str(ckpt) in line for line in result.stdout.splitlines()), result.stdout


def test_long_line_to_a_file_stays_one_line():
    out = io.StringIO()
    get_console(file=out).print(LONG_LINE, markup=False, highlight=False)
    assert len(LONG_LINE) > 300
    assert out.getvalue() == LONG_LINE + "\n"


def test_monitor_streams_a_long_worker_line_unwrapped(tmp_path, capsys):
    (tmp_path / "logs").mkdir()
    monitor = Monitor(str(tmp_path), max_steps=10)
    (tmp_path / "logs" / "rank0.log").write_text(LONG_LINE + "\nnext\n")
    monitor.poll()
    assert capsys.readouterr().out.splitlines() == [LONG_LINE, "next"]


def test_failure_report_keeps_traceback_lines_whole(tmp_path, capsys):
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "rank0.status").write_text(json.dumps({"status": "error"}))
    (logs / "rank0.log").write_text(f"Traceback (most recent call last):\n{LONG_LINE}\n")
    report_failure(Monitor(str(tmp_path), max_steps=10).console, str(tmp_path), "", 1)
    out = capsys.readouterr().out.splitlines()
    assert f"  {LONG_LINE}" in out
    assert any(line.startswith("llmtrain: rank 0 failed") and line.endswith("rank0.log:") for line in out)


def test_rule_in_a_file_keeps_a_normal_width():
    out = io.StringIO()
    get_console(file=out).rule("resolved config")
    line = out.getvalue().rstrip("\n")
    assert "resolved config" in line and "\n" not in line and 40 <= len(line) <= 120


def test_table_in_a_narrow_terminal_folds_paths():
    path = "/scratch/" + "deeply/nested/" * 8 + "checkpoints/step-0000002"
    table = fold_table("checkpoints")
    for col in ("step", "state", "path"):
        table.add_column(col)
    table.add_row("2", "complete", path)
    out = io.StringIO()
    get_console(file=out, force_terminal=True, width=60, color_system=None).print(table)
    text = out.getvalue()
    assert "…" not in text
    assert max(len(line) for line in text.splitlines()) <= 60
    cells = [line.split("│")[3].strip() for line in text.splitlines() if line.count("│") == 4]
    assert len(cells) > 1 and "".join(cells) == path
