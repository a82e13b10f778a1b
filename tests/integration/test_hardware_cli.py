"""`llmtrain plan` from the real binary refuses bf16 on a T4 in one line, exit 2."""

from __future__ import annotations

from conftest import run_cli


def test_plan_refuses_bf16_on_t4_in_one_line_exit_2():
    result = run_cli(["plan", "hardware=t4", "precision=bf16"], timeout=120)
    assert result.returncode == 2
    assert result.stderr == "llmtrain: error: precision: hardware=t4 has no bf16; use precision=fp16\n"
    assert result.stdout == ""
