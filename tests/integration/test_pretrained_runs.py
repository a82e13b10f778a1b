"""model.init_from through the launch command: shape or head mismatches refused before launch, and a Llama folder
under tp=2 starting from its weights (trained in-process: the loading is under test, not the launcher)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers.hf_folders import GPT2_SMALL, hf_gpt2, hf_llama, LLAMA, transformers  # noqa: F401

from llmtrain.checkpoint.pretrained import inspect_pretrained
from llmtrain.config import compose_config


def shard_of(folder: Path, key: str) -> Path:
    return folder / json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"][key]


def refused_launch(capsys, tmp_path: Path, *overrides: str) -> str:
    """`llmtrain launch` (in this process) refused before anything starts: its one error line."""
    from llmtrain.cli import main

    run_dir = tmp_path / "run"
    code = main(["launch", f"run.dir={run_dir}", "cluster.nproc_per_node=1", *overrides])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert not run_dir.exists()
    return err[0]


def test_gpt2_shape_or_head_mismatch_is_refused_before_launch(hf_gpt2, tmp_path, capsys):
    folder, _ = hf_gpt2
    base = [*GPT2_SMALL, f"model.init_from={folder}", "data=synthetic"]
    line = refused_launch(capsys, tmp_path, *base, "model.d_model=64")
    assert line == (f"llmtrain: error: model.init_from: embed.tok.weight is [250, 32] in "
                    f"{shard_of(folder, 'transformer.wte.weight')} but the config builds [250, 64] (model.d_model)")
    line = refused_launch(capsys, tmp_path, *base, "model.n_layers=3")
    assert line == f"llmtrain: error: model.init_from: missing tensor layers.2.ln_1.weight in {folder}"
    # Same shapes, other heads: only config.json can tell.
    line = refused_launch(capsys, tmp_path, *base, "model.n_heads=4")
    assert line == f"llmtrain: error: model.init_from: {folder / 'config.json'}: n_head=2 but model.n_heads=4"


def test_llama_mismatches_are_refused_before_launch(hf_llama, tmp_path, capsys):
    folder, _ = hf_llama
    base = [*LLAMA, "model.tie_embeddings=false", f"model.init_from={folder}", "data=synthetic"]
    key = "model.layers.0.self_attn.k_proj.weight"
    line = refused_launch(capsys, tmp_path, *base, "model.n_kv_heads=4")
    assert line == (f"llmtrain: error: model.init_from: layers.0.attn.k.weight is [32, 64] in {shard_of(folder, key)} "
                    f"but the config builds [64, 64] (model.n_kv_heads)")
    line = refused_launch(capsys, tmp_path, *base, "model.ffn_dim=128")
    assert line.startswith("llmtrain: error: model.init_from: layers.0.mlp.gate.weight is [96, 64] in ")
    assert line.endswith(" but the config builds [128, 64] (model.ffn_dim)")
    # What shapes cannot tell comes from config.json, one line naming the key to set.
    conf = folder / "config.json"
    line = refused_launch(capsys, tmp_path, *base, "model.rope_theta=10000")
    assert line == (f"llmtrain: error: model.init_from: {conf} has rope_theta=500000 but model.rope_theta=10000; "
                    f"set model.rope_theta=500000")
    line = refused_launch(capsys, tmp_path, *base, "model.rope_scaling.factor=32")
    assert line.endswith("has rope_scaling.factor=8.0 but model.rope_scaling.factor=32.0; set "
                         "model.rope_scaling.factor=8.0")
    line = refused_launch(capsys, tmp_path, *base[:-3], "model.tie_embeddings=true", f"model.init_from={folder}",
                          "data=synthetic")
    assert line == (f"llmtrain: error: model.init_from: {conf} has tie_word_embeddings=false but "
                    f"model.tie_embeddings=True; set model.tie_embeddings=false")
    line = refused_launch(capsys, tmp_path, "model.d_model=64", "model.n_heads=4", f"model.init_from={folder}",
                          "data=synthetic")
    assert line == (f"llmtrain: error: model.init_from: {folder} holds a HF Llama model but model.arch=gpt2; set "
                    f"model.arch=llama (and its sizes)")


@pytest.mark.slow
def test_init_from_hf_llama_under_tp2_starts_from_its_weights(hf_llama, tmp_path):
    """One run at tp=2: the first loss is the one a single process computes with the folder's weights, rank 0
    says what it loaded, and the run's checkpoint exports to a folder transformers gives the same logits from."""
    import torch.nn.functional as F

    from helpers.inprocess_run import train_in_process

    from llmtrain.data import SampleStream, build_dataset
    from llmtrain.model import build_model, init_parameters

    folder, _ = hf_llama
    overrides = [*LLAMA, "model.tie_embeddings=false", f"model.init_from={folder}", "data=synthetic",
                 "parallel.tp=2", "cluster.nproc_per_node=2", "train.max_steps=1", "train.global_batch_size=4",
                 "train.micro_batch_size=2", "train.eval_interval=0"]
    cfg = compose_config(overrides)
    source = inspect_pretrained(folder, cfg.model)
    model = build_model(cfg.model).eval()
    model.load_state_dict(source.load(), strict=False)
    stream = SampleStream(build_dataset(cfg.data, cfg.model, cfg.train.seed), cfg.train.seed)
    fresh = build_model(cfg.model).eval()
    init_parameters(fresh, cfg.train.seed, cfg.model.init_std, cfg.model.n_layers)  # what a run without it starts at

    def first_loss(m) -> float:
        with torch.no_grad():
            return torch.stack([F.cross_entropy(m(x).flatten(0, 1), y.flatten())
                                for x, y in (stream.batch("train", 0, i, 0, 1, 2, 4) for i in range(2))]).mean().item()

    expected = first_loss(model)
    assert abs(expected - first_loss(fresh)) > 0.1  # the comparison can tell the folder's weights from an init

    run_dir = tmp_path / "run"
    rows = train_in_process(run_dir, *overrides)
    first = [r for r in rows if "loss" in r][0]
    assert first["step"] == 1 and abs(first["loss"] - expected) <= 1e-5, (first, expected)
    log = (run_dir / "logs" / "rank0.log").read_text()
    assert f"llmtrain: {source.describe()}\n" in log

    # `llmtrain ckpt export RUN_DIR --format hf` of that tp=2 run: transformers gives llmtrain's logits.
    from llmtrain.checkpoint.export import load_model_state
    from llmtrain.cli import main

    out = tmp_path / "export"
    assert main(["ckpt", "export", str(run_dir), "--format", "hf", "--out", str(out)]) == 0
    state, _ = load_model_state(run_dir / "checkpoints" / "step-0000001")
    trained = build_model(cfg.model).eval()
    trained.load_state_dict(state, strict=False)
    hf = transformers.LlamaForCausalLM.from_pretrained(str(out), local_files_only=True).eval()
    ids = torch.randint(0, 250, (2, 64), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, trained(ids)[..., :250], atol=1e-4, rtol=0)
        assert not torch.equal(trained(ids), model(ids))  # one step was taken
