"""Bad input given to the real `llmtrain` binary: exit 2, one line, no traceback."""

from __future__ import annotations


def test_bad_input_from_the_real_binary_exits_2_without_traceback(tmp_path):
    from conftest import run_cli

    result = run_cli(["launch", "parallel.tp=3", f"run.dir={tmp_path / 'r'}"])
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "Traceback" not in result.stderr
    assert "parallel.tp" in result.stderr and not (tmp_path / "r").exists()


def test_options_after_overrides_through_main(tmp_path, capsys):
    """`llmtrain launch model=gpt-tiny --dry-run train.max_steps=5`: both overrides and the option are taken."""
    from llmtrain.cli import main

    run_dir = tmp_path / "r"
    assert main(["launch", "model=gpt-tiny", f"run.dir={run_dir}", "--dry-run", "train.max_steps=5",
                 "run.name=late"]) == 0
    out = capsys.readouterr().out
    assert "  max_steps: 5\n" in out and "  name: late\n" in out and "nothing was started" in out
    assert not run_dir.exists()  # a dry run: nothing written
