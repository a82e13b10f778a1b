"""Run reports: the dependency-free TensorBoard event writer/reader and `llmtrain report RUN_DIR`."""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import statistics
import struct

import pytest

from llmtrain.config import ConfigError, compose_config, to_yaml
from llmtrain.report.run_report import add_report_arguments, run_report
from llmtrain.report.tensorboard import FILE_VERSION, TensorBoardWriter, crc32c, read_events

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _f32(x: float) -> float:
    return struct.unpack("<f", struct.pack("<f", x))[0]


# ---------------------------------------------------------------------------------------------------- tensorboard

def test_crc32c_check_value():
    assert crc32c(b"123456789") == 0xE3069283
    assert crc32c(b"") == 0
    assert crc32c(b"56789", crc32c(b"1234")) == 0xE3069283  # continuation


def _write_scalars(log_dir):
    written = {
        1: {"loss": 4.4812, "lr": 5e-4, "grad_norm": 2.9},
        10: {"loss": 3.1, "lr": 1e-3, "tokens_per_s": 7430.25},
        2**40: {"loss": 2.5},
    }
    with TensorBoardWriter(log_dir) as w:
        for step, values in written.items():
            # non-numeric, None, non-finite and float32-overflowing values are skipped
            w.add_scalars(step, {**values, "name": "x", "skipped": None, "nan": math.nan, "inf": math.inf,
                                 "huge": 1e300}, wall_time=1000.0 + step % 100)
        w.add_scalars(11, {"nothing": None})  # nothing numeric: no event
        w.flush()
    return w.path, written


def test_tensorboard_roundtrip(tmp_path):
    path, written = _write_scalars(tmp_path / "tb")
    name = path.split("/")[-1]
    assert name.startswith("events.out.tfevents.") and name.endswith(".llmtrain")
    events = read_events(path)
    assert events[0]["file_version"] == FILE_VERSION and events[0]["scalars"] == {}
    assert events[0]["wall_time"] > 1e9
    scalar_events = events[1:]
    assert [e["step"] for e in scalar_events] == list(written)
    for e, (step, values) in zip(scalar_events, written.items()):
        assert e["scalars"] == {k: _f32(v) for k, v in values.items()}
        assert e["wall_time"] == 1000.0 + step % 100


def test_tensorboard_bad_crc(tmp_path):
    path, _ = _write_scalars(tmp_path / "tb")
    data = bytearray(open(path, "rb").read())
    for offset in (3, len(data) - 10):  # inside a length header, inside the last payload
        bad = bytearray(data)
        bad[offset] ^= 0x01
        open(path, "wb").write(bytes(bad))
        with pytest.raises(ValueError, match="CRC"):
            read_events(path)


def test_tensorboard_reads_our_events(tmp_path):
    if importlib.util.find_spec("tensorboard") is None:
        pytest.skip("tensorboard not installed: pip install tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    path, written = _write_scalars(tmp_path / "tb")
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    tags = sorted({k for values in written.values() for k in values})
    assert sorted(acc.Tags()["scalars"]) == tags
    for tag in tags:
        expected = [(s, _f32(v[tag])) for s, v in written.items() if tag in v]
        assert [(e.step, e.value) for e in acc.Scalars(tag)] == expected


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
                     "elapsed_s": 0.3 * step, "mem_gib": 0.4 + 0.001 * step, "tflops": 0.03, "mfu": 0.01})
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
    events = read_events(next((run_dir / "report" / "tensorboard").iterdir()))
    assert sum("train/loss" in e["scalars"] for e in events) == 50
    assert [e["step"] for e in events if "val/loss" in e["scalars"]] == [25, 50]


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
