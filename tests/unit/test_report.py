"""Run reports: TensorBoard scalars through torch.utils.tensorboard and `llmtrain report RUN_DIR`."""

from __future__ import annotations

import argparse
import json
import math
import statistics
import struct
import sys
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from llmtrain.config import ConfigError, compose_config, to_yaml
from llmtrain.launch.config_probes import validate_here
from llmtrain.report.run_report import add_report_arguments, run_report
from llmtrain.train.trackers.tensorboard import TensorBoardWriter

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
MISSING = ("needs the tensorboard package, which is not installed: pip install 'llmtrain[tensorboard]' "
           "(in a checkout: pip install -e '.[tensorboard]')")


def _f32(x: float) -> float:
    return struct.unpack("<f", struct.pack("<f", x))[0]


def _read_scalars(path) -> dict[str, list[tuple[int, float, float]]]:
    """{tag: [(step, value, wall_time), ...]} of an event file or folder, read by TensorBoard itself."""
    acc = EventAccumulator(str(path))
    acc.Reload()
    return {tag: [(e.step, e.value, e.wall_time) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


@pytest.fixture
def no_tensorboard(monkeypatch):
    """An interpreter without the tensorboard package: importing it fails, find_spec finds nothing."""
    for name in list(sys.modules):
        if name == "tensorboard" or name.startswith(("tensorboard.", "torch.utils.tensorboard")):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "tensorboard", None)


# ---------------------------------------------------------------------------------------------------- tensorboard

def _write_scalars(log_dir):
    written = {
        1: {"loss": 4.4812, "lr": 5e-4, "grad_norm": 2.9},
        10: {"loss": 3.1, "lr": 1e-3, "tokens_per_s": 7430.25},
        2**40: {"loss": 2.5},
    }
    with TensorBoardWriter(log_dir) as w:
        for step, values in written.items():
            # non-numeric, None, non-finite and float32-overflowing values are skipped
            assert w.add_scalars(step, {**values, "name": "x", "skipped": None, "nan": math.nan, "inf": math.inf,
                                        "huge": 1e300}, wall_time=1000.0 + step % 100) == len(values)
        assert w.add_scalars(11, {"nothing": None}) == 0  # nothing numeric: nothing written
        w.flush()
    return w.path, written


def test_tensorboard_scalars_read_back_by_tensorboard(tmp_path):
    path, written = _write_scalars(tmp_path / "tb")
    name = Path(path).name
    assert [p.name for p in (tmp_path / "tb").iterdir()] == [name]
    assert name.startswith("events.out.tfevents.") and name.endswith(".llmtrain")
    scalars = _read_scalars(path)
    tags = sorted({k for values in written.values() for k in values})
    assert sorted(scalars) == tags
    for tag in tags:
        assert scalars[tag] == [(s, _f32(v[tag]), 1000.0 + s % 100) for s, v in written.items() if tag in v]


def test_two_writers_in_one_folder_keep_both_files(tmp_path):
    first, _ = _write_scalars(tmp_path / "tb")
    second, _ = _write_scalars(tmp_path / "tb")
    assert first != second
    assert sorted(p.name for p in (tmp_path / "tb").iterdir()) == sorted(Path(p).name for p in (first, second))
    assert [s for s, _, _ in _read_scalars(first)["loss"]] == [1, 10, 2**40]


def test_closed_writer_refuses_scalars(tmp_path):
    w = TensorBoardWriter(tmp_path / "tb")
    w.close()
    with pytest.raises(ValueError, match="writer is closed"):
        w.add_scalars(1, {"loss": 1.0})


def test_missing_tensorboard_names_the_extra(tmp_path, no_tensorboard):
    with pytest.raises(ConfigError) as info:
        TensorBoardWriter(tmp_path / "tb")
    assert info.value.key == "logging.tensorboard"
    assert "pip install 'llmtrain[tensorboard]'" in info.value.message
    assert not (tmp_path / "tb").exists()


def test_missing_tensorboard_fails_validation_before_launch(tmp_path, capsys, no_tensorboard):
    from llmtrain.cli import main

    validate_here(compose_config(["logging.tensorboard=false"]))  # not asked for: nothing needed
    with pytest.raises(ConfigError) as info:
        validate_here(compose_config(["logging.tensorboard=true"]))
    assert info.value.key == "logging.tensorboard" and info.value.message == MISSING
    assert main(["launch", "--dry-run", "logging.tensorboard=true", f"run.dir={tmp_path / 'run'}"]) == 2
    captured = capsys.readouterr()
    assert captured.err == f"llmtrain: error: logging.tensorboard: {MISSING}\n" and captured.out == ""


# ---------------------------------------------------------------------------------------------------- report

def _fake_run(tmp_path):
    run_dir = tmp_path / "run1"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(to_yaml(compose_config(["train.max_steps=50"])))
    rows = []
    for step in range(1, 51):
        loss = 5.0 - 2.0 * math.log(step) / math.log(50) + 0.05 * math.sin(step)
        tps = 150.0 if step == 1 else 7000.0 + 37.0 * ((step * 7) % 13)  # the first row is the slow warm-up
        rows.append({"step": step, "loss": loss, "lr": 1e-3 * min(1.0, step / 5), "grad_norm": 1.0,
                     "tokens_per_s": tps, "step_time_s": 2048 / tps, "tokens": 2048 * step,
                     "elapsed_s": 0.3 * step, "mem_gib": 0.4 + 0.001 * step, "tflops": 0.03, "mfu": 0.01,
                     "peak_tflops": 3.0})
        if step in (25, 50):
            rows.append({"step": step, "val_loss": loss + 0.1})
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run_dir, rows


def _args(argv):
    parser = argparse.ArgumentParser()
    add_report_arguments(parser)
    return parser.parse_args(argv)


def test_report(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    run_dir, rows = _fake_run(tmp_path)
    train = [r for r in rows if "loss" in r]
    assert run_report(_args([str(run_dir), "--tensorboard"])) == 0
    out = capsys.readouterr().out
    for name in ("loss.png", "lr.png", "throughput.png"):
        path = run_dir / "report" / name
        assert path.read_bytes()[:8] == PNG_SIGNATURE, name
    assert not [p for p in (run_dir / "report").iterdir() if ".tmp" in p.name]
    min_loss = min(r["loss"] for r in train)
    median_tps = statistics.median(r["tokens_per_s"] for r in train[1:])
    assert f"{min_loss:.4f}" in out
    assert f"{median_tps:,.0f}" in out
    assert f"{rows[-1]['val_loss']:.4f}" in out
    assert "50 / 50" in out and "gpt-tiny" in out and "fp32" in out
    assert "102,400" in out  # tokens
    assert "1.0%" in out  # median MFU
    # the exported event file holds every train row and both evals
    event_file = next((run_dir / "report" / "tensorboard").iterdir())
    assert f"tensorboard: 52 train/val rows in {event_file}" in out
    scalars = _read_scalars(event_file)
    assert [(s, v) for s, v, _ in scalars["train/loss"]] == [(r["step"], _f32(r["loss"])) for r in train]
    assert [(s, v) for s, v, _ in scalars["val/loss"]] == [(r["step"], _f32(r["val_loss"])) for r in rows
                                                          if "val_loss" in r]
    assert [s for s, _, _ in scalars["val/loss"]] == [25, 50]
    assert "train/val_loss" not in scalars and "train/step" not in scalars


def test_report_tensorboard_without_the_package_is_one_line_exit_2(tmp_path, capsys, no_tensorboard):
    from llmtrain.cli import main

    run_dir, _ = _fake_run(tmp_path)
    assert main(["report", str(run_dir), "--tensorboard"]) == 2
    captured = capsys.readouterr()
    assert captured.err == f"llmtrain: error: --tensorboard: {MISSING}\n"
    assert captured.out == "" and not (run_dir / "report").exists()


def test_report_without_matplotlib_prints_the_table_and_how_to_get_the_plots(tmp_path, capsys, monkeypatch):
    from llmtrain.cli import main

    run_dir, rows = _fake_run(tmp_path)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    assert main(["report", str(run_dir), "--tensorboard"]) == 0
    captured = capsys.readouterr()
    assert "50 / 50" in captured.out and f"{rows[-1]['val_loss']:.4f}" in captured.out
    lines = captured.out.splitlines()
    assert lines[-2] == ("plots: none, matplotlib is not installed; for PNG plots: pip install 'llmtrain[plot]' "
                         "(in a checkout: pip install -e '.[plot]')")
    assert lines[-1].startswith("tensorboard: 52 train/val rows in ")  # the other output is still made
    assert captured.err == ""
    assert [p.name for p in (run_dir / "report").iterdir()] == ["tensorboard"]


def test_report_out_dir_and_no_config(tmp_path, capsys):
    run_dir, _ = _fake_run(tmp_path)
    (run_dir / "config.yaml").unlink()
    out_dir = tmp_path / "elsewhere"
    assert run_report(_args([str(run_dir), "--out", str(out_dir)])) == 0
    assert (out_dir / "throughput.png").read_bytes()[:8] == PNG_SIGNATURE
    assert "run1" in capsys.readouterr().out


def test_report_not_a_run_dir(tmp_path):
    with pytest.raises(ConfigError, match="not a run directory: no metrics.jsonl") as info:
        run_report(_args([str(tmp_path)]))
    assert info.value.key == str(tmp_path)


# ---------------------------------------------------------------------------------------------------- compare

def _compared_run(run_dir: Path, *overrides: str):
    """A run directory as a launch leaves it (config.yaml, three logged steps), loaded as compare loads it."""
    from llmtrain.report.compare import load_runs

    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(to_yaml(compose_config([f"run.dir={run_dir}", *overrides])))
    rows = [{"step": s, "loss": 5.0 - s, "tokens_per_s": 1000.0, "tokens": 1024 * s} for s in (1, 2, 3)]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run,), _ = load_runs([str(run_dir)])
    return run


def test_compare_shows_only_keys_whose_values_differ(tmp_path):
    from llmtrain.report.compare import Run, differing_keys

    plain = _compared_run(tmp_path / "a", "train.lr=0.001")
    in_sweep = _compared_run(tmp_path / "b", "train.lr=0.002", "+env.LLMTRAIN_SWEEP_NAME=s")
    assert plain.flat_config["env"] == {} and "env" not in in_sweep.flat_config
    # `env: {}` against an env that holds only the sweep's name (bookkeeping, as run.dir is): only train.lr.
    assert differing_keys([plain, in_sweep]) == ["train.lr"]
    traced = _compared_run(tmp_path / "c", "train.lr=0.001", "+env.NCCL_DEBUG=INFO")
    assert differing_keys([plain, in_sweep, traced]) == ["env.NCCL_DEBUG", "train.lr"]
    # Unset, null and an empty mapping are one value.
    runs = [Run(str(tmp_path / name), [], cfg=object()) for name in "xyz"]
    for run, flat in zip(runs, ({"a": None, "b": 1}, {"a": {}, "b": 1}, {"b": 1})):
        run.__dict__["flat_config"] = flat
    assert differing_keys(runs) == []
    runs[2].__dict__["flat_config"] = {"a": 0, "b": 1}
    assert differing_keys(runs) == ["a"]


def test_compare_writes_its_plot_where_asked_or_in_the_current_folder(tmp_path, monkeypatch, capsys):
    pytest.importorskip("matplotlib", reason="the plot extra is not installed")
    from llmtrain.report.compare import add_compare_arguments, run_compare

    parser = argparse.ArgumentParser()
    add_compare_arguments(parser)
    a, b = tmp_path / "a", tmp_path / "b"
    _compared_run(a, "train.lr=0.001")
    _compared_run(b, "train.lr=0.002")
    here = tmp_path / "here"
    (here / "plots").mkdir(parents=True)
    monkeypatch.chdir(here)
    assert run_compare(parser.parse_args([str(a), str(b)])) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "plot: compare.png"
    assert (here / "compare.png").read_bytes()[:8] == PNG_SIGNATURE
    assert not (a / "compare.png").exists() and not (b / "compare.png").exists()
    assert run_compare(parser.parse_args([str(a), str(b), "--out", "plots"])) == 0  # a folder: compare.png in it
    assert (here / "plots" / "compare.png").read_bytes()[:8] == PNG_SIGNATURE
    assert run_compare(parser.parse_args([str(a), str(b), "--out", str(tmp_path / "ab.png")])) == 0
    assert (tmp_path / "ab.png").read_bytes()[:8] == PNG_SIGNATURE
    assert sorted(p.name for p in a.iterdir()) == ["config.yaml", "metrics.jsonl"]
