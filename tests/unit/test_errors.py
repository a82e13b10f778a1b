"""The error layer: each error's exit code, the exit-code table of docs/guarantees.md, the console's message lines,
and a damaged checkpoint ending a command with exit 1 where a checkpoint asked for wrongly ends it with 2."""

from __future__ import annotations

import ast
import inspect
import json
import re
from pathlib import Path

import pytest

from llmtrain.checkpoint.resume import resolve_resume

from llmtrain import errors
from llmtrain.checkpoint import store
from llmtrain.cli import main
from llmtrain.console import error_line, fail, get_console, plain, say
from llmtrain.errors import (ObjectStoreError, EXIT_FAILED, EXIT_HANGUP, EXIT_INTERRUPTED, EXIT_OK, EXIT_PREEMPTED, EXIT_USAGE,
                             CancelError, CheckpointError, CheckpointUsageError, ConfigError, DataError, KeyedError,
                             LlmtrainError, StorageError, VerifyError)

ROOT = Path(__file__).resolve().parents[2]

EXPECTED_CODES = {
    LlmtrainError: EXIT_FAILED,
    KeyedError: EXIT_FAILED,
    ConfigError: EXIT_USAGE,
    DataError: EXIT_USAGE,
    CheckpointUsageError: EXIT_USAGE,
    CheckpointError: EXIT_FAILED,
    VerifyError: EXIT_FAILED,
    CancelError: EXIT_FAILED,
    StorageError: EXIT_FAILED,
    ObjectStoreError: EXIT_FAILED,
}


def test_every_error_carries_its_code():
    defined = {obj for _, obj in inspect.getmembers(errors, inspect.isclass) if issubclass(obj, LlmtrainError)}
    assert defined == set(EXPECTED_CODES)  # a new error class gets its code checked here
    assert {cls: cls.exit_code for cls in defined} == EXPECTED_CODES
    assert {cls: cls("k", "m").exit_code for cls in defined if issubclass(cls, KeyedError)} == {
        cls: code for cls, code in EXPECTED_CODES.items() if issubclass(cls, KeyedError)}


def test_the_codes_are_the_documented_ones():
    assert (EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_HANGUP, EXIT_INTERRUPTED, EXIT_PREEMPTED) == (0, 1, 2, 129, 130,
                                                                                                 143)
    text = (ROOT / "docs" / "guarantees.md").read_text()
    section = text.split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| (\d+) \| ([^|]+?)[:|]", section, flags=re.M)
    documented = {int(code): meaning.split(" (")[0].split(":")[0].strip() for code, meaning in rows}
    constants = {value: name for name, value in vars(errors).items() if name.startswith("EXIT_")}
    assert sorted(documented) == sorted(constants)
    assert documented == {EXIT_OK: "done", EXIT_FAILED: "failed", EXIT_USAGE: "bad input",
                          EXIT_HANGUP: "hung up", EXIT_INTERRUPTED: "interrupted", EXIT_PREEMPTED: "preempted"}


def test_keyed_errors_print_key_and_message_and_keep_both():
    for cls in (ConfigError, DataError, CheckpointError, CheckpointUsageError, VerifyError):
        e = cls("train.lr", "must be > 0, not -1")
        assert (str(e), e.key, e.message) == ("train.lr: must be > 0, not -1", "train.lr", "must be > 0, not -1")
    assert str(CancelError("not allowed to signal the launcher")) == "not allowed to signal the launcher"


def test_old_import_paths_name_the_same_classes():
    from llmtrain.checkpoint.verify import VerifyError as verify_home
    from llmtrain.config import ConfigError as config_package
    from llmtrain.config.errors import ConfigError as config_home
    from llmtrain.data import DataError as data_package
    from llmtrain.data.errors import DataError as data_home
    from llmtrain.jobs.cancel import CancelError as cancel_home

    assert config_home is config_package is ConfigError and data_home is data_package is DataError
    assert (store.CheckpointError, store.CheckpointUsageError, verify_home, cancel_home) == (
        CheckpointError, CheckpointUsageError, VerifyError, CancelError)
    # A refusal naming checkpoint.resume is still caught where bad config and damaged checkpoints are.
    assert issubclass(CheckpointUsageError, ConfigError) and issubclass(CheckpointUsageError, CheckpointError)
    assert not issubclass(CheckpointError, ConfigError)


def test_errors_module_imports_nothing_of_llmtrain():
    tree = ast.parse((ROOT / "llmtrain" / "errors.py").read_text())
    imported = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    imported += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert [m for m in imported if m.split(".")[0] == "llmtrain"] == []


def test_say_and_error_line_write_exact_plain_lines(tmp_path):
    long = "x" * 150  # wider than any default terminal: never wrapped
    path = tmp_path / "out.txt"
    with open(path, "w") as f:
        console = get_console(file=f)
        say(f"resuming from [bold]/runs/a[/bold] :smile: {long}", console=console)
        plain("  model.d_model: 64 -> 128", console=console)
        assert fail(CheckpointError("/runs/a/__0_0.distcp", "checkpoint file is missing"), console=console) == 1
        assert fail(ConfigError("train.lr", "must be > 0, not [-1]"), console=console) == 2
    assert path.read_bytes() == (
        f"llmtrain: resuming from [bold]/runs/a[/bold] :smile: {long}\n"
        "  model.d_model: 64 -> 128\n"
        "llmtrain: error: /runs/a/__0_0.distcp: checkpoint file is missing\n"
        "llmtrain: error: train.lr: must be > 0, not [-1]\n").encode()
    line = error_line(DataError("data.path", "no such file: a.bin"))
    assert line == "llmtrain: error: data.path: no such file: a.bin"


def test_say_err_goes_to_stderr_only(capsys):
    say("interrupted: nothing was written", err=True)
    assert fail(CancelError("scancel failed")) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err == "llmtrain: interrupted: nothing was written\nllmtrain: error: scancel failed\n"


def _checkpoint(run: Path, step: int, meta: bool = True) -> Path:
    path = run / "checkpoints" / f"step-{step:07d}"
    path.mkdir(parents=True)
    (path / ".metadata").write_bytes(b"index")
    (path / "__0_0.distcp").write_bytes(b"x" * 100)
    if meta:
        (path / "meta.json").write_text(json.dumps({"step": step, "files": store.file_manifest(str(path))}))
    return path


def test_a_truncated_shard_is_a_failure_and_a_wrong_resume_is_bad_input(tmp_path):
    path = _checkpoint(tmp_path / "run", 4)
    (path / "__0_0.distcp").write_bytes(b"x" * 99)
    with pytest.raises(CheckpointError) as e:
        store.verify(str(path))
    assert (type(e.value), e.value.exit_code) == (CheckpointError, EXIT_FAILED)
    assert str(e.value) == f"{path / '__0_0.distcp'}: checkpoint file is truncated or altered: 99 bytes, 100 written"
    with pytest.raises(CheckpointError) as e:
        resolve_resume(str(tmp_path / "run"), str(tmp_path / "nowhere"))
    assert (e.value.key, e.value.exit_code) == ("checkpoint.resume", EXIT_USAGE)


def test_cli_exits_1_on_a_corrupt_checkpoint_and_2_on_a_run_dir_without_one(tmp_path, capsys):
    run = tmp_path / "run"
    _checkpoint(run, 2)
    lost = _checkpoint(run, 4, meta=False)  # renamed from .tmp, then lost its meta.json: corrupt
    out = tmp_path / "out"
    assert main(["ckpt", "export", str(run), "--format", "safetensors", "--out", str(out)]) == EXIT_FAILED
    err = capsys.readouterr().err
    assert err.startswith(f"llmtrain: error: {lost}: corrupt checkpoint: meta.json is missing or unreadable")
    assert err.count("\n") == 1 and not out.exists()
    empty = tmp_path / "empty"
    (empty / "checkpoints").mkdir(parents=True)
    assert main(["ckpt", "export", str(empty), "--format", "safetensors", "--out", str(out)]) == EXIT_USAGE
    assert capsys.readouterr().err == (f"llmtrain: error: {empty}: run directory without a complete checkpoint "
                                       f"({empty / 'checkpoints'} holds no step-NNNNNNN folder)\n")
