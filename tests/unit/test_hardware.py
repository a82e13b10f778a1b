"""Hardware profiles: every GPU's name finds its profile, an unknown GPU trains without MFU, and a GPU without bf16
refuses precision=bf16 in one line, before anything starts."""

from __future__ import annotations

import re

import pytest
from conftest import REPO

from llmtrain.config import ConfigError, compose_config
from llmtrain.config import hardware_keys
from llmtrain.hardware import profiles as hardware
from llmtrain.hardware.gpu_names import GPU_PROFILES, profile_for
from llmtrain.hardware.profiles import load_profile
from llmtrain.launch.config_probes import validate_here
from llmtrain.plan.cli import plan_for


PROFILE_DIR = REPO / "configs" / "hardware"
GPU_PROFILE_NAMES = sorted(p.stem for p in PROFILE_DIR.glob("*.yaml") if p.stem not in ("auto", "cpu"))

# torch.cuda.get_device_name() as these GPUs report it.
DEVICE_NAMES = [
    ("NVIDIA H100 80GB HBM3", "h100"),
    ("NVIDIA H100", "h100"),
    ("NVIDIA H100 PCIe", "h100-pcie"),
    ("NVIDIA H100 NVL", "h100-nvl"),
    ("NVIDIA H200", "h200"),
    ("NVIDIA H200 NVL", "h200-nvl"),
    ("NVIDIA GH200 480GB", "gh200"),
    ("NVIDIA H20", "h20"),
    ("NVIDIA B200", "b200"),
    ("NVIDIA GB200", "gb200"),
    ("NVIDIA A100-SXM4-80GB", "a100"),
    ("NVIDIA A100-SXM4-40GB", "a100"),
    ("NVIDIA A100-PCIE-40GB", "a100"),
    ("NVIDIA A100 80GB PCIe", "a100"),
    ("NVIDIA A10G", "a10g"),
    ("NVIDIA A10", "a10"),
    ("NVIDIA L4", "l4"),
    ("NVIDIA L40S", "l40s"),
    ("NVIDIA GeForce RTX 4090", "rtx4090"),
    ("NVIDIA RTX 6000 Ada Generation", "rtx6000ada"),
    ("Tesla V100-SXM2-32GB", "v100"),
    ("Tesla V100-PCIE-16GB", "v100"),
    ("Tesla T4", "t4"),
    ("AMD Instinct MI250X", "mi250x"),
    ("AMD Instinct MI250X / MI250", "mi250x"),
    ("AMD Instinct MI300X", "mi300x"),
    # Other cards, with other peaks: no profile rather than a neighbour's.
    ("NVIDIA L40", None),
    ("NVIDIA RTX A6000", None),
    ("Quadro RTX 6000", None),
    ("NVIDIA GeForce RTX 4090 D", None),
    ("Tesla V100S-PCIE-32GB", None),
    ("NVIDIA H800", None),
    ("AMD Instinct MI250", None),
    ("AMD Instinct MI325X", None),
]


@pytest.mark.parametrize("device, profile", DEVICE_NAMES, ids=[d for d, _ in DEVICE_NAMES])
def test_device_names_find_their_profile(device, profile):
    assert profile_for(device) == profile


def test_every_pattern_names_a_profile_file_and_every_gpu_profile_has_a_pattern():
    assert sorted({profile for _, profile in GPU_PROFILES}) == GPU_PROFILE_NAMES
    assert len(GPU_PROFILE_NAMES) == 20


def test_readme_lists_every_profile():
    row = next(line for line in (REPO / "docs" / "configs.md").read_text().splitlines() if line.startswith("| `hardware` |"))
    options = row.split("|")[2]
    assert sorted(re.findall(r"`([a-z0-9-]+)`", options)) == sorted(["auto", "cpu", *GPU_PROFILE_NAMES])


@pytest.mark.parametrize("name", GPU_PROFILE_NAMES)
def test_gpu_profiles_are_complete_and_validate(name):
    profile = load_profile(name)
    assert profile.name == name
    peaks = dict(profile.peak_tflops)
    assert set(peaks) <= set(hardware_keys.PEAK_DTYPES)
    assert {"float32", "float16"} <= set(peaks) and all(v > 0 for v in peaks.values())
    # A faster format never has a lower peak: catches a sparse figure or a slipped digit.
    order = [peaks[d] for d in ("float32", "tfloat32", "float16", "float8") if d in peaks]
    assert order == sorted(order)
    assert profile.memory_gib > 0 and profile.intra_node_gbs > 0 and profile.inter_node_gbs > 0
    amd = name.startswith("mi")
    assert (profile.compute_capability is None) == amd
    validate_here(compose_config([f"hardware={name}", "precision=fp16"]))


def test_datasheet_peaks_and_capabilities():
    def row(name):
        p = load_profile(name)
        return dict(p.peak_tflops), hardware_keys.parse_capability(p.compute_capability), p.memory_gib

    assert row("h100") == ({"float32": 67.0, "tfloat32": 494.5, "bfloat16": 989.0, "float16": 989.0,
                            "float8": 1979.0}, (9, 0), 80)
    assert row("b200") == ({"float32": 75.0, "tfloat32": 1100.0, "bfloat16": 2250.0, "float16": 2250.0,
                            "float8": 4500.0}, (10, 0), 180)
    assert row("a100") == ({"float32": 19.5, "tfloat32": 156.0, "bfloat16": 312.0, "float16": 312.0}, (8, 0), 80)
    assert row("t4") == ({"float32": 8.1, "float16": 65.0}, (7, 5), 16)
    assert row("v100") == ({"float32": 15.7, "float16": 125.0}, (7, 0), 32)
    assert row("mi250x") == ({"float32": 47.85, "bfloat16": 191.5, "float16": 191.5}, None, 64)


@pytest.mark.parametrize("overrides, capability", [
    (["hardware=l4"], (8, 9)), (["hardware=h100"], (9, 0)), (["hardware=b200"], (10, 0)),
    (["hardware=mi300x"], None), (["hardware=cpu"], None), (["hardware=auto"], None),
    (["hardware=auto", "+hardware.compute_capability=8.6"], (8, 6)),
])
def test_profile_compute_capability(overrides, capability):
    assert hardware.profile_compute_capability(compose_config(overrides)) == capability


def test_bad_hardware_keys_are_one_line_errors():
    with pytest.raises(ConfigError) as e:
        validate_here(compose_config(["+hardware.peak_tflops.bf16=400"]))
    assert str(e.value) == ("hardware.peak_tflops.bf16: unknown dtype 'bf16' (choose from float32, tfloat32, "
                            "bfloat16, float16, float8)")
    with pytest.raises(ConfigError) as e:
        validate_here(compose_config(["hardware=h100", "hardware.peak_tflops.bfloat16=0"]))
    assert str(e.value) == "hardware.peak_tflops.bfloat16: must be > 0 (got 0.0)"
    with pytest.raises(ConfigError) as e:
        validate_here(compose_config(["hardware=h100", "hardware.compute_capability=sm90"]))
    assert str(e.value) == "hardware.compute_capability: must be 'major.minor' such as \"9.0\", or null (got sm90)"


@pytest.mark.parametrize("gpu", ["v100", "t4"])
def test_bf16_on_a_gpu_without_it_is_refused_before_launch(gpu):
    with pytest.raises(ConfigError) as e:
        validate_here(compose_config([f"hardware={gpu}", "precision=bf16"]))
    assert e.value.key == "precision"
    assert str(e.value) == f"precision: hardware={gpu} has no bf16; use precision=fp16"
    validate_here(compose_config([f"hardware={gpu}", "precision=fp16"]))


# ---- hardware=auto: the worker's detection, simulated -----------------------------------------------------------

def _detected(monkeypatch, device: str) -> None:
    """Make hardware=auto see a GPU named `device` (24 GiB, capability 8.9) while the run uses this CPU."""
    monkeypatch.setattr(hardware, "device_name", lambda device_type=None: device)
    monkeypatch.setattr(hardware, "device_memory_gib", lambda: 24.0)
    monkeypatch.setattr(hardware, "device_capability", lambda: "8.9")


def _resolve(*overrides):
    cfg = compose_config(list(overrides))
    return hardware.resolve(cfg.hardware, cfg.precision.compute_dtype, load_profile)


def test_auto_uses_the_detected_profile_and_given_peaks_win(monkeypatch):
    _detected(monkeypatch, "NVIDIA H100 80GB HBM3")
    hw = _resolve("precision=bf16")
    assert (hw["name"], hw["device"], hw["peak_tflops"], hw["memory_gib"], hw["compute_capability"]) == \
        ("h100", "NVIDIA H100 80GB HBM3", 989.0, 80, "9.0")
    assert _resolve("precision=bf16", "+hardware.peak_tflops.bfloat16=900")["peak_tflops"] == 900.0


def test_auto_on_an_unknown_gpu_has_no_peak(monkeypatch):
    _detected(monkeypatch, "NVIDIA L40")
    hw = _resolve("precision=bf16")
    assert (hw["name"], hw["device"], hw["peak_tflops"], hw["memory_gib"], hw["compute_capability"]) == \
        ("gpu", "NVIDIA L40", None, 24.0, "8.9")
    assert hardware.missing_peak(hw, "bfloat16") == (
        "no hardware profile matches this GPU (NVIDIA L40): give its dense peak with "
        "+hardware.peak_tflops.bfloat16=<TFLOPS> (or choose a hardware= profile)")
    assert _resolve("precision=bf16", "+hardware.peak_tflops.bfloat16=181")["peak_tflops"] == 181.0
    # plan needs a peak for its step time: a one-line error there.
    with pytest.raises(ConfigError) as e:
        plan_for(compose_config(["precision=bf16"]))
    assert str(e.value) == "hardware: " + hardware.missing_peak(hw, "bfloat16")


def test_auto_on_a_t4_refuses_bf16(monkeypatch):
    _detected(monkeypatch, "Tesla T4")
    with pytest.raises(ConfigError) as e:
        _resolve("precision=bf16")
    assert str(e.value) == "precision: hardware=t4 (detected: Tesla T4) has no bf16; use precision=fp16"
    assert _resolve("precision=fp16")["peak_tflops"] == 65.0


def test_auto_with_the_cpu_has_no_peak_unless_given(monkeypatch):
    """A CPU's peak is not measured at start-up (it swings with the load): none, unless the user gives one."""
    monkeypatch.setattr(hardware, "device_name", lambda device_type=None: None)
    monkeypatch.setattr(hardware, "measured_cpu_tflops", lambda: pytest.fail("a CPU peak was measured"))
    hw = _resolve("precision=bf16")
    assert hw["name"] == "cpu" and hw["device"] is None and hw["peak_tflops"] is None and hw["memory_gib"] > 0
    assert hardware.missing_peak(hw, "bfloat16") == (
        "no known peak for this CPU; give its dense peak with +hardware.peak_tflops.bfloat16=<TFLOPS> to show it")
    assert _resolve("precision=bf16", "+hardware.peak_tflops.bfloat16=0.2")["peak_tflops"] == 0.2


def test_a_cpu_plan_is_timed_at_its_measured_matmul_speed_without_mfu(monkeypatch):
    monkeypatch.setattr(hardware, "measured_cpu_tflops", lambda: 0.5)
    plan = plan_for(compose_config(["hardware=cpu"]))
    assert plan.mfu is None and plan.hardware["measured_tflops"] == 0.5
    assert "step time assumes matmuls at 50% of this CPU's matmul speed measured now (0.5 TFLOPS), TP/PP " \
        "transfers exposed, DP overlapped with backward" in plan.notes
    given = plan_for(compose_config(["hardware=cpu", "+hardware.peak_tflops.float32=0.5"]))
    assert given.step_time_s == pytest.approx(plan.step_time_s)
    assert given.mfu == pytest.approx(given.flops_per_token * given.tokens_per_s / (0.5e12 * given.world_size))


def test_a_peak_the_profile_lacks_is_added_with_plus(capsys):
    from llmtrain.cli import main

    assert main(["config", "hardware=cpu", "hardware.peak_tflops.float32=1.5"]) == 2
    assert capsys.readouterr().err == ("llmtrain: error: hardware.peak_tflops.float32: not in this profile's peak "
                                       "table: add it with +hardware.peak_tflops.float32=<TFLOPS> (with '+')\n")


# ---- a real (CPU) training run on a simulated GPU ---------------------------------------------------------------

TINY = ["data=synthetic", "model.n_layers=2", "model.d_model=32", "model.n_heads=2", "model.seq_len=16",
        "cluster.nproc_per_node=1", "train.micro_batch_size=2", "train.global_batch_size=2", "train.max_steps=2",
        "train.log_interval=1", "train.eval_interval=0", "train.warmup_steps=1", "checkpoint.at_end=false",
        "checkpoint.resume=none"]


def _trainer(overrides, run_dir):
    import torch

    from llmtrain.train.trainer import Trainer

    cfg = compose_config([*TINY, *overrides])
    validate_here(cfg)
    return Trainer(cfg, str(run_dir), torch.device("cpu"))


def test_training_on_an_unknown_gpu_reports_no_mfu(monkeypatch, tmp_path, one_rank, capsys):
    from conftest import read_rows

    _detected(monkeypatch, "NVIDIA L40")
    _trainer(["precision=fp32"], tmp_path).train()
    out = capsys.readouterr().out
    said = [line for line in out.splitlines() if "MFU" in line]
    assert said == ["llmtrain: MFU not shown: no hardware profile matches this GPU (NVIDIA L40): give its dense peak "
                    "with +hardware.peak_tflops.float32=<TFLOPS> (or choose a hardware= profile)"]
    steps = [line for line in out.splitlines() if line.startswith("step ")]
    assert len(steps) == 2 and all(line.endswith(" ms/step") for line in steps)
    rows = read_rows(tmp_path)
    assert [r["step"] for r in rows] == [1, 2]
    assert all("mfu" not in r and r["tflops"] > 0 for r in rows)


def test_training_on_the_cpu_shows_mfu_only_with_a_given_peak(tmp_path, one_rank, capsys):
    from conftest import read_rows

    for name in ("none", "given"):
        (tmp_path / name).mkdir()
    _trainer(["hardware=cpu", f"run.dir={tmp_path / 'none'}"], tmp_path / "none").train()
    out = capsys.readouterr().out
    assert [line for line in out.splitlines() if "MFU" in line] == [
        "llmtrain: MFU not shown: no known peak for this CPU; give its dense peak with "
        "+hardware.peak_tflops.float32=<TFLOPS> to show it"]
    assert all("mfu" not in r and r["tflops"] > 0 for r in read_rows(tmp_path / "none"))
    _trainer(["hardware=cpu", "+hardware.peak_tflops.float32=1000", f"run.dir={tmp_path / 'given'}"],
             tmp_path / "given").train()
    steps = [line for line in capsys.readouterr().out.splitlines() if line.startswith("step ")]
    rows = read_rows(tmp_path / "given")
    assert [r["peak_tflops"] for r in rows] == [1000.0, 1000.0]
    assert all(r["mfu"] == pytest.approx(r["tflops"] / 1000) for r in rows)
    assert [line.rsplit(" | ", 1)[1] for line in steps] == [f"MFU {r['mfu']:.1%}" for r in rows]


def test_training_with_bf16_on_a_t4_stops_at_start(monkeypatch, tmp_path, one_rank):
    _detected(monkeypatch, "Tesla T4")
    with pytest.raises(ConfigError) as e:
        _trainer(["precision=bf16"], tmp_path)
    assert str(e.value) == "precision: hardware=t4 (detected: Tesla T4) has no bf16; use precision=fp16"
    assert not (tmp_path / "metrics.jsonl").exists()
