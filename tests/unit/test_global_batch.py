"""The global batch does not follow the layout: a fixed default on a fresh run, the checkpoint's on a resume, an
explicit value only when the user sets one; the micro-batch size fills each dp rank's share (config/batch.py,
launch/resumed_batch.py)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from rich.console import Console

from llmtrain.cli import main
from llmtrain.config import batch, builtin_config_dir, compose_config, to_yaml
from llmtrain.config.errors import ConfigError
from llmtrain.launch.config_probes import compose_here, validate_here
from llmtrain.launch.launch_record import LaunchRecord, batch_origin, newest_launch
from llmtrain.launch.run import check_resume

# overrides -> (dp, micro-batch size, micro-batches per dp rank); the global batch is 16 for every one.
LAYOUTS = {
    "dp2 (the demo)": ([], (2, 8, 1)),
    "tp2 sp": (["parallel.tp=2", "parallel.sequence_parallel=true"], (1, 8, 2)),
    "one process": (["cluster.nproc_per_node=1"], (1, 8, 2)),
    "dp8": (["cluster.nproc_per_node=8"], (8, 2, 1)),
    "dp2 tp2": (["cluster.nproc_per_node=4", "parallel.tp=2"], (2, 8, 1)),
    "pp2": (["parallel.pp=2"], (1, 4, 4)),
    "pp2 interleaved": (["parallel.pp=2", "parallel.pp_schedule=interleaved_1f1b", "parallel.virtual_stages=2"],
                        (1, 2, 8)),
    "gpt-1.3b dp2 tp2 pp2": (["model=gpt-1.3b", "parallel.tp=2", "parallel.pp=2", "cluster.nproc_per_node=8"],
                             (2, 2, 4)),
    "llama3-8b pp4": (["model=llama3-8b", "parallel.pp=4", "cluster.nproc_per_node=4"], (1, 2, 8)),
}


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_a_fresh_run_has_the_default_global_batch_whatever_the_layout(name):
    overrides, (dp, micro, accum) = LAYOUTS[name]
    cfg = compose_config(overrides)
    validate_here(cfg)
    t = cfg.train
    assert (t.global_batch_size, cfg.parallel.dp, t.micro_batch_size) == (batch.DEFAULT_GLOBAL_BATCH_SIZE, dp, micro)
    assert t.global_batch_size // (t.micro_batch_size * dp) == accum


@pytest.mark.parametrize("model", sorted(p.stem for p in (builtin_config_dir() / "model").glob("*.yaml")))
def test_every_built_in_model_takes_the_default_global_batch_on_8_processes(model):
    cfg = compose_config([f"model={model}", "cluster.nproc_per_node=8"])
    validate_here(cfg)
    assert (cfg.train.global_batch_size, cfg.parallel.dp, cfg.train.micro_batch_size) == (16, 8, 2)


@pytest.mark.parametrize("args,micro", [
    ((16, 2), 8), ((16, 1), 8), ((16, 8), 2), ((16, 16), 1), ((64, 2), 8),
    ((16, 1, 2), 4), ((16, 2, 2), 2), ((16, 1, 2, 2), 2), ((12, 1, 2), 3),  # 2 x pp x v micro-batches, m % pp == 0
    ((4, 1, 4), 1), ((16, 3), 1), ((8, 16), 1),  # too few or indivisible: 1, and validation names the keys
])
def test_the_default_micro_batch_is_the_largest_up_to_8_that_divides_a_ranks_share(args, micro):
    assert batch.auto_micro_batch(*args) == micro


def test_an_indivisible_global_batch_is_one_line_naming_the_keys_and_the_valid_choices(capsys):
    code = main(["config", "cluster.nproc_per_node=4", "train.micro_batch_size=8"])
    err = capsys.readouterr().err
    assert code == 2 and err == (
        "llmtrain: error: train.global_batch_size: train.global_batch_size=16 is not a multiple of "
        "train.micro_batch_size x parallel.dp = 8 x 4 = 32: set train.global_batch_size to a multiple of 32 (32, 64, "
        "96, ...); or train.micro_batch_size to 1, 2 or 4; or parallel.dp to 1 or 2 (processes = dp x tp x pp)\n")
    with pytest.raises(ConfigError) as e:
        validate_here(compose_config(["cluster.nproc_per_node=3"]))
    assert e.value.message.endswith("set train.global_batch_size to a multiple of 3 (3, 6, 9, ...); or "
                                    "parallel.dp to 1, 2, 4, 8 or 16 (processes = dp x tp x pp)")


def test_plan_widens_a_default_global_batch_the_layout_cannot_divide_and_says_so(capsys):
    """plan, tune and doctor look at a layout: the default 16 over 32 dp ranks becomes 32 with a line on stderr
    (launch refuses it instead); a global batch the user set is never widened."""
    args = ["plan", "model=llama3-8b", "cluster.nnodes=4", "cluster.nproc_per_node=8", "hardware=h100", "--json"]
    main(args)
    captured = capsys.readouterr()
    assert captured.err == ("llmtrain: train.global_batch_size: the default 16 does not divide over parallel.dp=32; "
                            "using 32 here (a launch needs it set: train.global_batch_size=N)\n")
    planned = json.loads(captured.out)
    assert planned["fits_with"]  # the plan itself came: the smallest change that fits is named
    origin: dict[str, str] = {}
    cfg = compose_here(["cluster.nproc_per_node=6", "parallel.pp=2"], (), origin)
    assert batch.widen_default_for_layout(cfg, origin) is not None
    assert (cfg.train.global_batch_size, cfg.train.micro_batch_size) == (18, 1)  # dp 3 x pp 2 divides it
    validate_here(cfg)
    origin = {}
    cfg = compose_here(["cluster.nproc_per_node=3", "train.global_batch_size=16"], (), origin)
    assert batch.widen_default_for_layout(cfg, origin) is None and cfg.train.global_batch_size == 16


def test_the_origin_of_the_global_batch(tmp_path):
    (tmp_path / "conf" / "train").mkdir(parents=True)
    (tmp_path / "conf" / "train" / "big.yaml").write_text("global_batch_size: 64\n")
    for overrides, dirs, origin in [([], [], "default"), (["train.global_batch_size=16"], [], "override"),
                                    (["train.global_batch_size=null"], [], "default"),
                                    (["train=big"], [str(tmp_path / "conf")], "config")]:
        origins: dict[str, str] = {}
        compose_config(overrides, dirs, origins=origins)
        assert origins[batch.GLOBAL_KEY] == origin, overrides
    assert batch.batch_words("default", 16) == "train.global_batch_size=16 from the config default; "
    assert batch.batch_words("checkpoint", 32) == "train.global_batch_size=32 kept from the checkpoint; "
    assert batch.batch_words(None, 16) == ""


def _run_with_checkpoint(tmp_path: Path, *overrides: str) -> Path:
    """A run directory whose newest complete checkpoint (step 4) was saved by a launch with `overrides`."""
    run_dir = tmp_path / "run"
    cfg = compose_config([f"run.dir={run_dir}", *overrides])
    folder = run_dir / "checkpoints" / "step-0000004"
    folder.mkdir(parents=True)
    (folder / ".metadata").write_bytes(b"")
    (folder / "meta.json").write_text(json.dumps({"step": 4, "files": {}}))
    (folder / "config.yaml").write_text(to_yaml(cfg))
    (run_dir / "config.yaml").write_text(to_yaml(cfg))
    return run_dir


def _resume(run_dir: Path, *overrides: str) -> tuple:
    """compose_here + check_resume as `llmtrain launch` runs them: the config, the origins, what was said."""
    origins: dict[str, str] = {}
    cfg = compose_here([f"run.dir={run_dir}", *overrides], origins=origins)
    validate_here(cfg)
    console = Console(record=True, width=400)
    check_resume(cfg, console, origins)
    return cfg, origins, console.export_text()


def test_a_resume_under_another_layout_keeps_the_checkpoints_global_batch(tmp_path):
    run_dir = _run_with_checkpoint(tmp_path, "train.global_batch_size=32")
    cfg, origins, said = _resume(run_dir, "parallel.tp=2", "parallel.sequence_parallel=true")
    assert (cfg.train.global_batch_size, cfg.parallel.dp, cfg.train.micro_batch_size) == (32, 1, 8)  # 4 micro-batches
    assert origins[batch.GLOBAL_KEY] == "checkpoint"
    assert "  parallel.dp: 2 -> 1\n" in said and "global_batch_size" not in said


def test_a_kept_global_batch_is_the_one_validated_against_the_new_layout(tmp_path):
    # dp=3 cannot share the default 16 samples, but shares the checkpoint's 48 (fewer nodes, the same batch).
    run_dir = _run_with_checkpoint(tmp_path, "train.global_batch_size=48", "cluster.nproc_per_node=6")
    cfg, origins, _ = _resume(run_dir, "cluster.nproc_per_node=3")
    assert (cfg.train.global_batch_size, cfg.parallel.dp, cfg.train.micro_batch_size) == (48, 3, 8)
    # An explicit micro-batch size stays, and is checked against the kept global batch.
    with pytest.raises(ConfigError) as e:
        _resume(run_dir, "cluster.nproc_per_node=3", "train.micro_batch_size=32")
    assert e.value.message.startswith("train.global_batch_size=48 is not a multiple of train.micro_batch_size x "
                                      "parallel.dp = 32 x 3 = 96")


def test_an_explicit_global_batch_changes_on_resume_and_the_changes_list_says_so(tmp_path):
    run_dir = _run_with_checkpoint(tmp_path, "train.global_batch_size=32")
    cfg, origins, said = _resume(run_dir, "train.global_batch_size=16")
    assert cfg.train.global_batch_size == 16 and origins[batch.GLOBAL_KEY] == "override"
    assert "  train.global_batch_size: 32 -> 16\n" in said


def test_a_run_moved_aside_starts_with_the_default_global_batch(tmp_path):
    run_dir = _run_with_checkpoint(tmp_path, "train.global_batch_size=32")
    cfg, origins, said = _resume(run_dir, "train.seed=7", "run.overwrite=true")  # another seed: a new run
    assert "moved the earlier run" in said
    assert (cfg.train.global_batch_size, cfg.train.micro_batch_size, origins[batch.GLOBAL_KEY]) == (16, 8, "default")


def test_the_launch_record_tells_the_worker_where_the_global_batch_came_from(tmp_path):
    cfg = compose_config([f"run.dir={tmp_path}"])
    backend = SimpleNamespace(name="local", host_names=lambda: ["here"])
    LaunchRecord.start(cfg, backend, None, "checkpoint")
    entry = newest_launch(str(tmp_path))
    assert batch_origin(entry, 16) == "checkpoint"
    assert batch_origin(entry, 32) is None  # a record about another value says nothing
    assert batch_origin({}, 16) is None
