"""Checkpoint export: safetensors files, DCP -> safetensors / Hugging Face GPT-2, and init_from loading.

Single process, no process group; a checkpoint is a DCP save of a small random GPT plus its config.yaml.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from llmtrain.checkpoint.export import export_checkpoint, load_model_state
from llmtrain.checkpoint.pretrained import load_pretrained
from llmtrain.checkpoint.safetensors_io import read_safetensors, read_safetensors_metadata, write_safetensors
from llmtrain.checkpoint.export_cli import add_export_arguments, run_export
from llmtrain.config import ConfigError, compose_config, to_yaml
from llmtrain.model import GPT, GPTArgs

SMALL = ["model.n_layers=2", "model.d_model=32", "model.n_heads=2", "model.seq_len=32"]


def make_checkpoint(path: Path, *overrides: str, seed: int = 0):
    """A DCP checkpoint folder like the trainer's: {"model", "optim", "extra"} + config.yaml + meta.json."""
    cfg = compose_config([*SMALL, *overrides])
    torch.manual_seed(seed)
    model = GPT(GPTArgs.from_config(cfg.model))
    with torch.no_grad():
        for name, p in model.named_parameters():
            # Non-trivial everywhere (biases and LayerNorm included) so any mis-mapped tensor shows in the logits.
            p.copy_(torch.randn_like(p) * (0.3 if p.dim() > 1 else 0.1) + (1.0 if ".ln_" in name or
                                                                            name.startswith("norm.") else 0.0))
    params = {n: p.detach() for n, p in model.named_parameters()}
    state = {"model": params,
             "optim": {f"{n}.exp_avg": torch.zeros_like(p) for n, p in params.items()},
             "extra": {"step": 7}}
    path.mkdir(parents=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "assuming the intent is to save in a single process"
        dcp.save(state, checkpoint_id=str(path), no_dist=True)
    (path / "config.yaml").write_text(to_yaml(cfg))
    (path / "meta.json").write_text(json.dumps({"step": 7}))
    return model.eval(), cfg


@pytest.fixture(scope="module")
def ckpt256(tmp_path_factory):
    path = tmp_path_factory.mktemp("ck") / "step-0000007"
    model, cfg = make_checkpoint(path, "model.vocab_size=256")
    return path, model, cfg


@pytest.fixture(scope="module")
def ckpt250(tmp_path_factory):
    path = tmp_path_factory.mktemp("ck") / "step-0000007"
    model, cfg = make_checkpoint(path, "model.vocab_size=250", "model.vocab_pad_multiple=128", seed=1)
    assert model.embed.tok.weight.shape[0] == 256
    return path, model, cfg


@pytest.fixture(scope="module")
def ckpt_mlp48(tmp_path_factory):
    """A GPT-2 whose MLP width and LayerNorm epsilon are not the defaults (model.ffn_dim, model.norm_eps)."""
    path = tmp_path_factory.mktemp("ck") / "step-0000007"
    model, cfg = make_checkpoint(path, "model.vocab_size=256", "model.ffn_dim=48", "model.norm_eps=0.5", seed=2)
    return path, model, cfg


def _dir_snapshot(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


# ---- safetensors ---------------------------------------------------------------------------------------------


def test_safetensors_round_trip_is_exact_and_header_aligned(tmp_path):
    g = torch.Generator().manual_seed(0)
    base = torch.randn(10, generator=g)
    tensors = {
        "a.f32": torch.randn(3, 5, generator=g),
        "b.bf16": torch.randn(7, generator=g).to(torch.bfloat16),
        "c.i64": torch.randint(-2**40, 2**40, (2, 3, 2), generator=g),
        "d.scalar": torch.tensor(3.5),
        "e.empty": torch.empty(0, 4),
        "f.noncontig": torch.randn(4, 6, generator=g).t(),
        "g.view": base[:4],  # two views of one storage
        "h.view": base[2:],
    }
    path = tmp_path / "x.safetensors"
    write_safetensors(tensors, path, {"format": "pt", "note": "hi"})
    back = read_safetensors(path)
    assert sorted(back) == sorted(tensors)
    for name, t in tensors.items():
        assert back[name].dtype == t.dtype and back[name].shape == t.shape, name
        assert back[name].contiguous().view(-1).view(torch.uint8).tolist() == \
            t.contiguous().view(-1).view(torch.uint8).tolist(), name
    assert read_safetensors_metadata(path) == {"format": "pt", "note": "hi"}

    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    assert (8 + n) % 8 == 0
    header = json.loads(raw[8:8 + n])
    assert header["__metadata__"] == {"format": "pt", "note": "hi"}
    assert header["b.bf16"]["dtype"] == "BF16" and header["b.bf16"]["shape"] == [7]
    begin, end = header["b.bf16"]["data_offsets"]
    assert end - begin == 14
    assert len(raw) == 8 + n + max(v["data_offsets"][1] for k, v in header.items() if k != "__metadata__")
    assert not [p for p in tmp_path.iterdir() if p.name != "x.safetensors"]  # no temp file left
    assert path.stat().st_mode & 0o777 == 0o666 & ~_process_umask()


def _process_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_failed_write_leaves_the_old_file_and_no_temp_file(tmp_path):
    path = tmp_path / "x.safetensors"
    write_safetensors({"w": torch.ones(3)}, path)
    before = path.read_bytes()
    with pytest.raises(TypeError, match="bad: not a tensor"):
        write_safetensors({"w": torch.zeros(3), "bad": [1.0]}, path)
    with pytest.raises((TypeError, ValueError)):
        write_safetensors({"w": torch.zeros(3)}, path, {"step": 7})  # metadata maps str to str
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["x.safetensors"]


def test_corrupt_safetensors_is_a_config_error_naming_the_file(tmp_path):
    path = tmp_path / "x.safetensors"
    write_safetensors({"w": torch.randn(10)}, path)
    path.write_bytes(path.read_bytes()[:-4])
    for read in (read_safetensors, read_safetensors_metadata):
        with pytest.raises(ConfigError, match="not a valid safetensors file") as e:
            read(path)
        assert e.value.key == str(path)
    with pytest.raises(ConfigError, match="cannot read") as e:
        read_safetensors(tmp_path / "missing.safetensors")
    assert e.value.key == str(tmp_path / "missing.safetensors")


# ---- DCP -> tensors ------------------------------------------------------------------------------------------


def test_load_model_state_gives_full_tensors_with_llmtrain_names(ckpt250):
    path, model, cfg = ckpt250
    tensors, loaded_cfg = load_model_state(path)
    assert loaded_cfg.model.vocab_size == 250
    expected = dict(model.named_parameters())
    assert set(tensors) == set(expected)
    for name, t in tensors.items():
        assert t.dtype == torch.float32 and torch.equal(t, expected[name].detach()), name


# ---- export --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("which", ["ckpt256", "ckpt250", "ckpt_mlp48"])
def test_hf_export_loads_in_transformers_with_equal_logits(which, request, tmp_path):
    path, model, cfg = request.getfixturevalue(which)
    out = tmp_path / "hf"
    summary = export_checkpoint(path, "hf", out)
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    vocab = cfg.model.vocab_size
    conf = json.loads((out / "config.json").read_text())
    assert conf["vocab_size"] == vocab and conf["n_layer"] == 2 and conf["n_embd"] == 32
    sd = read_safetensors(out / "model.safetensors")
    assert sd["transformer.wte.weight"].shape == (vocab, 32)
    assert sd["transformer.h.0.attn.c_attn.weight"].shape == (32, 96)
    assert summary["num_params"] == model.num_params() - (model.args.vocab_size - vocab) * 32

    try:
        import transformers
    except ImportError:
        pytest.skip("transformers not installed: pip install transformers")
    hf = transformers.GPT2LMHeadModel.from_pretrained(str(out), local_files_only=True).eval()
    assert hf.lm_head.weight.data_ptr() == hf.transformer.wte.weight.data_ptr()  # tied
    ids = torch.randint(0, vocab, (2, cfg.model.seq_len), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ours = model(ids)[..., :vocab]
        theirs = hf(ids).logits.float()
    assert theirs.shape == ours.shape
    assert ours.abs().max() > 1.0  # the comparison is not between near-zero logits
    torch.testing.assert_close(theirs, ours, atol=1e-4, rtol=0)


def test_safetensors_export_has_llmtrain_names_and_real_vocab(ckpt250, tmp_path):
    path, model, cfg = ckpt250
    out = tmp_path / "nested" / "st"
    export_checkpoint(path, "safetensors", out)
    assert sorted(p.name for p in out.iterdir()) == ["config.yaml", "model.safetensors"]
    sd = read_safetensors(out / "model.safetensors")
    params = dict(model.named_parameters())
    assert set(sd) == set(params)
    assert torch.equal(sd["embed.tok.weight"], params["embed.tok.weight"].detach()[:250])
    assert torch.equal(sd["layers.1.attn.q.weight"], params["layers.1.attn.q.weight"].detach())
    meta = read_safetensors_metadata(out / "model.safetensors")
    assert meta["format"] == "pt" and meta["vocab_size"] == "250" and meta["step"] == "7"
    assert not [p for p in out.parent.iterdir() if p.name != "st"]  # temp folder gone


@pytest.mark.parametrize("fmt", ["hf", "safetensors"])
def test_load_pretrained_gives_back_the_original_tensors(fmt, ckpt250, tmp_path):
    path, model, cfg = ckpt250
    out = tmp_path / fmt
    export_checkpoint(path, fmt, out)
    tensors = load_pretrained(out, cfg.model)
    params = {n: p.detach() for n, p in model.named_parameters()}
    assert list(tensors) == list(params)
    for name, t in tensors.items():
        if name == "embed.tok.weight":
            assert t.shape == (256, 32)
            assert torch.equal(t[:250], params[name][:250])
            assert torch.count_nonzero(t[250:]) == 0
        else:
            assert t.dtype == torch.float32 and torch.equal(t, params[name]), name
    # The single file works too, and a loaded model gives the same logits on real token ids.
    single = load_pretrained(out / "model.safetensors", cfg.model)
    assert all(torch.equal(single[n], tensors[n]) for n in tensors)
    fresh = GPT(GPTArgs.from_config(cfg.model)).eval()
    fresh.load_state_dict(tensors, strict=False)
    ids = torch.randint(0, 250, (1, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(fresh(ids)[..., :250], model(ids)[..., :250])


def test_load_pretrained_reads_pytorch_model_bin(ckpt256, tmp_path):
    path, model, cfg = ckpt256
    out = tmp_path / "hf"
    export_checkpoint(path, "hf", out)
    sd = read_safetensors(out / "model.safetensors")
    # An old-style hub checkpoint: no "transformer." prefix, causal-mask buffers, an lm_head copy.
    legacy = {k.removeprefix("transformer."): v for k, v in sd.items()}
    legacy["h.0.attn.bias"] = torch.ones(1, 1, 32, 32)
    legacy["lm_head.weight"] = sd["transformer.wte.weight"]
    (out / "model.safetensors").unlink()
    torch.save(legacy, out / "pytorch_model.bin")
    tensors = load_pretrained(out, cfg.model)
    for name, p in model.named_parameters():
        assert torch.equal(tensors[name], p.detach()), name


def test_load_pretrained_shape_mismatch_names_the_tensor(ckpt256, tmp_path):
    path, model, cfg = ckpt256
    out = tmp_path / "st"
    export_checkpoint(path, "safetensors", out)
    wider = compose_config(["model.n_layers=2", "model.d_model=64", "model.n_heads=2", "model.seq_len=32",
                            "model.vocab_size=256"]).model
    with pytest.raises(ConfigError) as e:
        load_pretrained(out, wider)
    assert e.value.key == "model.init_from"
    assert e.value.message == (f"embed.tok.weight is [256, 32] in {out / 'model.safetensors'} but the config "
                               f"builds [256, 64] (model.d_model)")
    deeper = compose_config([*SMALL, "model.vocab_size=256", "model.n_layers=3"]).model
    with pytest.raises(ConfigError, match="missing tensor layers.2.ln_1.weight"):
        load_pretrained(out, deeper)


def test_hf_export_refuses_head_dim_that_gpt2_cannot_express(tmp_path):
    path = tmp_path / "ck"
    make_checkpoint(path, "model.vocab_size=256", "model.head_dim=8")
    with pytest.raises(ConfigError) as e:
        export_checkpoint(path, "hf", tmp_path / "out")
    assert e.value.key == "--format"
    assert not (tmp_path / "out").exists()
    export_checkpoint(path, "safetensors", tmp_path / "out")  # the llmtrain format can
    assert (tmp_path / "out" / "model.safetensors").is_file()


# ---- errors --------------------------------------------------------------------------------------------------


def test_export_into_non_empty_out_is_refused_and_changes_nothing(ckpt256, tmp_path):
    path, _, _ = ckpt256
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    before = _dir_snapshot(tmp_path)
    with pytest.raises(ConfigError) as e:
        export_checkpoint(path, "hf", out)
    assert e.value.key == "--out" and str(out) in e.value.message
    assert _dir_snapshot(tmp_path) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    # An existing empty folder is fine.
    empty = tmp_path / "empty"
    empty.mkdir()
    export_checkpoint(path, "safetensors", empty)
    assert (empty / "model.safetensors").is_file()


def test_checkpoint_without_config_yaml_is_a_config_error(ckpt256, tmp_path):
    src, _, _ = ckpt256
    path = tmp_path / "ck"
    shutil.copytree(src, path)
    (path / "config.yaml").unlink()
    for call in (lambda: load_model_state(path), lambda: export_checkpoint(path, "hf", tmp_path / "out")):
        with pytest.raises(ConfigError) as e:
            call()
        assert str(path / "config.yaml") in e.value.key
    assert not (tmp_path / "out").exists()
    with pytest.raises(ConfigError, match="no such checkpoint folder"):
        load_model_state(tmp_path / "nowhere")


def test_truncated_metadata_is_a_config_error_naming_it(ckpt256, tmp_path):
    src, _, _ = ckpt256
    path = tmp_path / "ck"
    shutil.copytree(src, path)
    meta = path / ".metadata"
    meta.write_bytes(meta.read_bytes()[:40])
    with pytest.raises(ConfigError) as e:
        export_checkpoint(path, "safetensors", tmp_path / "out")
    assert e.value.key == str(meta) and "corrupt" in e.value.message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]


def test_cli_prints_one_summary_line(ckpt256, tmp_path, capsys):
    path, model, _ = ckpt256
    parser = argparse.ArgumentParser()
    add_export_arguments(parser)
    args = parser.parse_args([str(path), "--format", "hf", "--out", str(tmp_path / "hf")])
    assert run_export(args) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1 and str(tmp_path / "hf") in lines[0] and f"{model.num_params():,} parameters" in lines[0]
    with pytest.raises(SystemExit):
        parser.parse_args([str(path), "--format", "onnx", "--out", "x"])


# ---- a run directory -----------------------------------------------------------------------------------------


def _run_dir_with(tmp_path: Path, src: Path, complete: dict[str, int], partial: list[str]) -> Path:
    """A run directory like the trainer's (config.yaml, logs/, checkpoints/) holding copies of checkpoint `src`."""
    run = tmp_path / "run"
    (run / "logs").mkdir(parents=True)
    shutil.copy(src / "config.yaml", run / "config.yaml")
    for name, step in complete.items():
        shutil.copytree(src, run / "checkpoints" / name)
        (run / "checkpoints" / name / "meta.json").write_text(json.dumps({"step": step}))
    for name in partial:  # a save that did not finish: no meta.json
        shutil.copytree(src, run / "checkpoints" / name)
        (run / "checkpoints" / name / "meta.json").unlink()
    return run


def test_cli_exports_the_newest_complete_checkpoint_of_a_run_dir(ckpt256, tmp_path, capsys):
    src, model, _ = ckpt256
    run = _run_dir_with(tmp_path, src, {"step-0000003": 3, "step-0000007": 7}, ["step-0000009.tmp"])
    parser = argparse.ArgumentParser()
    add_export_arguments(parser)
    out = tmp_path / "st"
    assert run_export(parser.parse_args([str(run), "--format", "safetensors", "--out", str(out)])) == 0
    newest = run / "checkpoints" / "step-0000007"
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0] == f"exporting {newest} (newest complete checkpoint of {run})"
    assert len(lines) == 2 and lines[1].startswith(f"exported {newest} as llmtrain safetensors to {out}")
    assert read_safetensors_metadata(out / "model.safetensors")["step"] == "7"
    sd = read_safetensors(out / "model.safetensors")
    assert torch.equal(sd["layers.1.attn.q.weight"], dict(model.named_parameters())["layers.1.attn.q.weight"])


@pytest.mark.parametrize("contents", ["partial", "empty", "no checkpoints folder"])
def test_run_dir_without_a_complete_checkpoint_is_one_line_exit_2(contents, ckpt256, tmp_path, capsys):
    from llmtrain.cli import main

    src, _, _ = ckpt256
    run = _run_dir_with(tmp_path, src, {}, ["step-0000005.tmp", "step-0000006"] if contents == "partial" else [])
    if contents == "empty":
        (run / "checkpoints").mkdir()
    assert main(["ckpt", "export", str(run), "--format", "hf", "--out", str(tmp_path / "out")]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"llmtrain: error: {run}: run directory without a complete checkpoint")
    if contents == "partial":
        assert "step-0000005.tmp, step-0000006 (no meta.json)" in err[0]
    assert captured.out == "" and not (tmp_path / "out").exists()
