"""Output written to a file or pipe is never cut or re-wrapped; in a terminal, tables fit and fold."""

from __future__ import annotations

import io
import json

from llmtrain.console import fold_table, get_console
from llmtrain.launch.supervision.failures import report_failure
from llmtrain.launch.supervision.monitor import Monitor


LONG_LINE = "x" * 120 + " Traceback line with words " + "/very/long/module/path" * 7 + " end"


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
