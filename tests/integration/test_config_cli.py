"""Bad input given to the real `llmtrain` binary: exit 2, one line, no traceback."""

from __future__ import annotations


def test_bad_input_from_the_real_binary_exits_2_without_traceback(tmp_path):
    from conftest import run_cli

    result = run_cli(["launch", "parallel.tp=3", f"run.dir={tmp_path / 'r'}"])
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "Traceback" not in result.stderr
    assert "parallel.tp" in result.stderr and not (tmp_path / "r").exists()
