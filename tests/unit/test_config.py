"""Composition, overrides and validation: every bad input is one line naming the key, exit 2, nothing started."""

from __future__ import annotations

import subprocess

import pytest
from omegaconf import OmegaConf

from llmtrain.cli import main
from llmtrain.config import ConfigError, compose_config
from llmtrain.launch.config_probes import validate_here


def compose(*overrides, config_dirs=()):
    cfg = compose_config(list(overrides), config_dirs)
    validate_here(cfg)
    return cfg


def test_defaults_compose_to_the_embedded_default():
    cfg = compose()
    assert cfg.model.name == "gpt-tiny" and cfg.data.name == "stdlib" and cfg.cluster.name == "local"
    assert (cfg.model.n_layers, cfg.model.n_heads, cfg.model.d_model, cfg.model.vocab_size) == (4, 4, 128, 256)
    # dp defaults to world / (tp * pp)
    assert cfg.parallel.dp == cfg.cluster.nnodes * cfg.cluster.nproc_per_node == 2
    assert (cfg.train.global_batch_size, cfg.train.micro_batch_size) == (16, 8)  # 1 micro-batch per dp rank


def test_default_micro_batch_fills_the_pipeline_of_the_default_global_batch():
    cfg = compose("model=gpt-1.3b", "parallel.tp=2", "parallel.pp=2", "cluster.nproc_per_node=8")
    # 16 samples over dp=2: 8 per rank, in 2 x pp = 4 micro-batches of 2.
    assert (cfg.parallel.dp, cfg.train.global_batch_size, cfg.train.micro_batch_size) == (2, 16, 2)


@pytest.mark.parametrize("name,layers,width,heads", [
    ("gpt-125m", 12, 768, 12), ("gpt-350m", 24, 1024, 16), ("gpt-760m", 24, 1536, 16),
    ("gpt-1.3b", 24, 2048, 16), ("gpt-2.7b", 32, 2560, 32), ("gpt-6.7b", 32, 4096, 32),
    ("gpt-13b", 40, 5120, 40), ("gpt-175b", 96, 12288, 96)])
def test_gpt3_paper_sizes(name, layers, width, heads):
    cfg = compose(f"model={name}")
    assert (cfg.model.n_layers, cfg.model.d_model, cfg.model.n_heads) == (layers, width, heads)
    assert cfg.model.vocab_size == 50257 and cfg.model.seq_len == 2048


def test_group_and_key_overrides_and_dp_default():
    cfg = compose("model=gpt-125m", "parallel.tp=2", "parallel.pp=2", "cluster.nproc_per_node=8",
                  "precision=bf16", "model.vocab_size=50304", "train.global_batch_size=32")
    assert cfg.parallel.dp == 2 and cfg.precision.compute_dtype == "bfloat16"
    assert cfg.model.vocab_size == 50304


def test_plus_and_tilde_overrides():
    cfg = compose("+env.NCCL_DEBUG=INFO", "network=infiniband")
    assert cfg.env.NCCL_DEBUG == "INFO" and cfg.network.env.NCCL_IB_DISABLE == "0"
    cfg = compose("~network.env.NCCL_IB_HCA", "network=infiniband")
    assert "NCCL_IB_HCA" not in cfg.network.env
    # A schema key cannot be deleted (the default would come back in its place): see test_deleting_a_schema_key_*.


def test_user_config_dir_adds_and_shadows_options(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "my-gpt.yaml").write_text(
        "name: my-gpt\nn_layers: 2\nn_heads: 2\nd_model: 32\nvocab_size: 256\nseq_len: 32\n")
    (tmp_path / "network").mkdir()
    (tmp_path / "network" / "ethernet.yaml").write_text("name: ethernet\nenv:\n  NCCL_SOCKET_IFNAME: eth7\n")
    cfg = compose("model=my-gpt", "network=ethernet", config_dirs=[str(tmp_path)])
    assert cfg.model.d_model == 32 and cfg.run.name == "my-gpt"
    assert dict(cfg.network.env) == {"NCCL_SOCKET_IFNAME": "eth7"}


def test_config_command_prints_resolved_yaml(capsys):
    assert main(["config", "model=gpt-350m", "run.name=x"]) == 0
    cfg = OmegaConf.create(capsys.readouterr().out)
    assert cfg.model.n_layers == 24 and cfg.run.dir == "runs/x"


BAD_INPUTS = [
    (["model.n_layer=3"], "model.n_layer"),                                   # typo'd key
    (["+model.n_layer=3"], "model.n_layer"),                                  # added key not in the schema
    (["train.lr=fast"], "train.lr"),                                          # wrong type
    (["parallel.tp=two"], "parallel.tp"),                                     # wrong type
    (["doctor.connect_timeout_s=0"], "doctor.connect_timeout_s"),             # checked before any launch
    (["model=gpt-9b"], "model"),                                              # missing group option
    (["precision=fp4"], "precision"),                                         # missing group option
    (["parallel.tp=3", "cluster.nproc_per_node=3"], "parallel.tp"),           # tp does not divide heads
    (["model.d_model=130"], "model.d_model"),                                 # width not divisible by heads
    (["train.global_batch_size=12", "train.micro_batch_size=8"], "train.global_batch_size"),  # 12 / (8 x 2)
    (["parallel.pp=2", "train.global_batch_size=8", "train.micro_batch_size=8"],
     "train.global_batch_size"),                                              # 1 micro-batch < pp
    (["parallel.dp=4"], "parallel.dp"),                                       # world size mismatch
    (["parallel.pp=2", "model.n_layers=3"], "parallel.pp"),                   # layers by pp
    (["data=memmap", "data.path=/nonexistent/tokens.bin"], "data.path"),      # missing data file
    (["data=memmap"], "data.path"),                                           # required path not given
    (["train.max_steps=0"], "train.max_steps"),                               # positive sizes
    (["device=tpu"], "device"),
    (["parallel.zero=1"], "parallel.zero"),
    (["parallel.pp=2", "parallel.pp_schedule=interleaved_1f1b"], "parallel.virtual_stages"),
    (["parallel.pp=2", "parallel.pp_layers=[1,2]"], "parallel.pp_layers"),
    (["model.vocab_size=255", "model.vocab_pad_multiple=5", "parallel.tp=2"],
     "model.vocab_pad_multiple"),                                             # padded vocab not divisible by tp
    (["--config-dir", "/nonexistent/configs"], "--config-dir"),
    (["train.lr=="], "train.lr"),                                             # unparsable override
    (["profile.memory=true", "profile.steps=[1,2]"], "profile.memory"),       # two profilers at once
    (["cluster.nproc_per_node=0"], "cluster.nproc_per_node"),                 # not reported as parallel.dp
    (["run.dir=/proc/llmtrain-run"], "run.dir"),                              # a folder that cannot be made
]

# Habits from other Hydra apps: each is refused with a line that says what llmtrain wants instead.
HYDRA_HABITS = [
    (["hydra.run.dir=/tmp/out"], "hydra.run.dir", "run.dir=/tmp/out"),
    (["env.NCCL_DEBUG=INFO"], "env.NCCL_DEBUG", "+env.NCCL_DEBUG="),
    (["+model=gpt-125m"], "model", "model=gpt-125m (no '+')"),
    (["train.lr=1e-3,3e-4"], "train.lr", "give one value"),
    (["train.seed=range(1,4)"], "train.seed", "give one value"),
]
BAD_INPUTS += [(overrides, key) for overrides, key, _ in HYDRA_HABITS]


@pytest.mark.parametrize("overrides,key,hint", HYDRA_HABITS, ids=[h[1] for h in HYDRA_HABITS])
def test_hydra_habits_get_a_hint(overrides, key, hint, capsys):
    code = main(["config", *overrides])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"llmtrain: error: {key}:") and hint in err, err


@pytest.mark.parametrize("argv,hint", [(["config", "--cfg", "job"], "llmtrain config"),
                                       (["launch", "--info"], "llmtrain config"),
                                       (["config", "-m", "train.lr=1,2"], "llmtrain launch -m")])
def test_hydra_flags_point_to_llmtrain_commands(argv, hint, capsys):
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and hint in err, err


def test_cuda_without_cuda_is_refused_before_anything_starts(tmp_path, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: device=cuda is valid here")
    for command in ("launch", "doctor"):
        code = main([command, f"run.dir={tmp_path / command}", "device=cuda"])
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1 and err.startswith("llmtrain: error: device:"), err
        assert not (tmp_path / command).exists()


def test_slurm_without_sbatch_leaves_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))  # no sbatch here, whatever the machine has
    code = main(["launch", f"run.dir={tmp_path / 'run'}", "cluster=slurm", "cluster.nnodes=1"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "sbatch is not on PATH" in err, err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("overrides,line", [
    (["cluster.nproc_per_node=2"], "#SBATCH --gpus-per-node=2"),
    (["cluster.nproc_per_node=2", "cluster.gpus_per_node=4"], "#SBATCH --gpus-per-node=4"),
    (["cluster.nproc_per_node=2", "device=cpu"], None)])
def test_slurm_requests_one_gpu_per_process(overrides, line, capsys):
    assert main(["launch", "--dry-run", "cluster=slurm", "cluster.nnodes=1", *overrides]) == 0
    requested = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("#SBATCH --gpus-per-node")]
    assert requested == ([line] if line else [])


@pytest.mark.parametrize("overrides,key", BAD_INPUTS, ids=[k + ":" + " ".join(o) for o, k in BAD_INPUTS])
def test_bad_input_is_one_line_naming_the_key(overrides, key, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run_dir = tmp_path / "run"
    # max_steps=1 first: should a rule be missing, the job that starts is short (and the test fails on its exit code).
    code = main(["launch", f"run.dir={run_dir}", "train.max_steps=1", *overrides])
    err = capsys.readouterr().err
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"llmtrain: error: {key}:"), lines[0]
    assert not run_dir.exists() and not (tmp_path / "runs").exists()


def test_config_error_carries_key():
    with pytest.raises(ConfigError) as info:
        compose("train.micro_batch_size=-1")
    assert info.value.key == "train.micro_batch_size"


def _choice_fields(schema, prefix=""):
    import dataclasses

    for f in dataclasses.fields(schema):
        if dataclasses.is_dataclass(f.default_factory):
            yield from _choice_fields(f.default_factory, f"{prefix}{f.name}.")
        elif "choices" in f.metadata:
            yield f"{prefix}{f.name}", f.metadata["choices"]


def test_every_field_with_fixed_values_is_checked_against_the_schema():
    from llmtrain.config.schema import LLMTrainConfig

    fields = dict(_choice_fields(LLMTrainConfig))
    # The allowed values are declared once, in the schema; these are some of them.
    assert fields["parallel.pp_schedule"][:2] == ("gpipe", "1f1b") and fields["parallel.zero"] == (0, 2, 3)
    assert fields["data.dtype"] == ("uint16", "uint32", None) and fields["device"] == ("auto", "cpu", "cuda")
    assert len(fields) >= 11
    for key, allowed in fields.items():
        bad = 7 if isinstance(allowed[0], int) else "bogus"
        cfg = compose_config([])
        OmegaConf.update(cfg, key, bad, merge=False)
        with pytest.raises(ConfigError) as e:
            validate_here(cfg)
        shown = ", ".join(str(a) for a in allowed if a is not None)
        assert str(e.value) == f"{key}: must be one of {shown} (got {bad})", key


def test_the_config_stays_typed_from_composition_to_the_worker(tmp_path):
    from omegaconf.errors import ValidationError

    from llmtrain.config import load_run_config, to_yaml

    cfg = compose("checkpoint.async=true")
    assert OmegaConf.get_type(cfg) is not dict and cfg.checkpoint.async_save is True
    with pytest.raises(ValidationError):
        cfg.train.max_steps = "many"
    # config.yaml holds the keys users write; read back, it is typed again.
    text = to_yaml(cfg)
    assert "  async: true\n" in text and "async_save" not in text
    (tmp_path / "config.yaml").write_text(text)
    again = load_run_config(tmp_path / "config.yaml")
    assert again.checkpoint.async_save is True and again == cfg
    with pytest.raises(ValidationError):
        again.parallel.tp = "two"


# ---- overrides that need quoting, unknown keys, deletions ------------------------------------------------------

@pytest.mark.parametrize("override, value, hint", [
    ("run.dir=/a/it's", "/a/it's", """run.dir="/a/it's" (in a shell: "run.dir=\\"/a/it's\\"")"""),
    ("run.dir=/runs/a b (c)", "/runs/a b (c)", """run.dir="/runs/a b (c)" (in a shell: 'run.dir="/runs/a b (c)"')"""),
])
def test_a_value_that_needs_quoting_names_the_key_and_a_form_that_works(override, value, hint, capsys):
    assert main(["config", override]) == 2
    err = capsys.readouterr().err
    assert err == (f"llmtrain: error: run.dir: Hydra's override grammar cannot read the value {value} unquoted; "
                   f"quote it: {hint}\n")
    # The shell form, given to a real shell, reaches Hydra as the quoted form, which composes to the value.
    shell_form = err.rsplit("(in a shell: ", 1)[1][:-2]
    argv = subprocess.run(["bash", "-c", f"printf '%s\\0' {shell_form}"], capture_output=True, text=True,
                          check=True).stdout.split("\0")[:-1]
    assert argv == [hint.split(" (in a shell")[0]]
    assert compose_config(argv).run.dir == value


def test_an_unknown_key_in_a_config_dir_file_names_the_file_and_the_close_key(tmp_path, capsys):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "mine.yaml").write_text("name: mine\nn_layer: 3\nn_heads: 2\nd_model: 32\n")
    assert main(["config", "--config-dir", str(tmp_path), "model=mine"]) == 2
    assert capsys.readouterr().err == (f"llmtrain: error: model.n_layer: unknown key in {tmp_path}/model/mine.yaml "
                                       "(not in the schema; did you mean model.n_layers?)\n")
    # A file that puts its keys at the top (# @package _global_) is found too.
    (tmp_path / "model" / "top.yaml").write_text("# @package _global_\nmodel:\n  name: top\ntrain:\n  max_step: 3\n")
    assert main(["config", "--config-dir", str(tmp_path), "model=top"]) == 2
    assert capsys.readouterr().err == (f"llmtrain: error: train.max_step: unknown key in {tmp_path}/model/top.yaml "
                                       "(not in the schema; did you mean train.max_steps?)\n")


@pytest.mark.parametrize("override, line", [
    ("model.n_layer=3", "model.n_layer: unknown key (not in the schema; did you mean model.n_layers?)"),
    ("+train.warmup_step=3", "train.warmup_step: unknown key (not in the schema; did you mean train.warmup_steps?)"),
    ("trian.lr=3", "trian: unknown key (not in the schema; did you mean train?)"),
    ("+foo.bar=3", "foo: unknown key (not in the schema; check its spelling)"),
])
def test_an_unknown_key_in_an_override_gets_the_close_key(override, line, capsys):
    assert main(["config", override]) == 2
    assert capsys.readouterr().err == f"llmtrain: error: {line}\n"


@pytest.mark.parametrize("override, line", [
    ("~model.n_layers", "model.n_layers: the schema defines this key, so ~model.n_layers would bring back its "
                        "default, not delete it; set it instead: model.n_layers=VALUE"),
    ("~checkpoint.async=true", "checkpoint.async: the schema defines this key, so ~checkpoint.async would bring "
                               "back its default, not delete it; set it instead: checkpoint.async=VALUE"),
    ("~checkpoint", "checkpoint: the schema defines this key, so ~checkpoint would bring back its default, not "
                    "delete it; set its keys instead: checkpoint.KEY=VALUE"),
    ("~network.env", "network.env: the schema defines this key, so ~network.env would bring back its default, not "
                     "delete it; add or delete its entries instead: +network.env.NAME=VALUE, ~network.env.NAME"),
    ("~model", "model: a config group cannot be deleted (~model would leave the schema's defaults in its place); "
               "choose an option instead: model=OPTION (llmtrain --help lists them)"),
    ("~train", "train: a config group cannot be deleted (~train would leave the schema's defaults in its place); "
               "choose an option instead: train=OPTION (llmtrain --help lists them)"),
])
def test_deleting_a_schema_key_is_refused_saying_how_to_set_it(override, line, capsys):
    assert main(["config", "model=gpt-125m", override]) == 2
    captured = capsys.readouterr()
    assert captured.err == f"llmtrain: error: {line}\n" and captured.out == ""


def test_entries_of_free_maps_stay_deletable():
    cfg = compose_config(["network=infiniband", "+env.A=1", "+env.B=2", "~network.env.NCCL_IB_HCA", "~env.A"])
    assert "NCCL_IB_HCA" not in cfg.network.env and cfg.network.env.NCCL_IB_DISABLE == "0"
    assert dict(cfg.env) == {"B": "2"}


def test_help_lists_only_usable_options_and_retired_ones_still_answer(capsys):
    from llmtrain.cli import build_parser

    parser = build_parser()
    helps = [parser.format_help()] + [parser._subparsers._group_actions[0].choices[c].format_help()
                                      for c in ("launch", "config", "plan")]
    for text in helps:
        assert [ln.strip() for ln in text.splitlines() if ln.strip().startswith("precision ")] == [
            "precision  bf16, fp16, fp32, fp8"]
        assert "apex-o" not in text
    assert main(["config", "precision=fp64"]) == 2
    assert capsys.readouterr().err == ("llmtrain: error: precision: no config option 'fp64' in group 'precision' "
                                       "(available: bf16, fp16, fp32, fp8)\n")
    assert main(["config", "precision=apex-o1"]) == 2
    assert capsys.readouterr().err.startswith("llmtrain: error: precision: apex-o1 is retired: current NVIDIA apex "
                                              "has no amp")
