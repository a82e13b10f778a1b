"""model.init_from: Hugging Face GPT-2 and Llama folders (single or sharded safetensors) and llmtrain exports,
checked against the config before launch from the files' headers, and loaded with the same logits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from llmtrain.checkpoint.pretrained import inspect_pretrained, load_pretrained
from llmtrain.config import ConfigError, compose_config
from llmtrain.model.gpt import GPT, GPTArgs

transformers = pytest.importorskip("transformers", reason="transformers not installed: pip install transformers")

GPT2_SMALL = ["model.n_layers=2", "model.d_model=32", "model.n_heads=2", "model.seq_len=32", "model.vocab_size=250"]


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


@pytest.fixture(scope="module")
def hf_gpt2(tmp_path_factory):
    """A random GPT2LMHeadModel made by transformers, saved in shards."""
    conf = transformers.GPT2Config(vocab_size=250, n_positions=64, n_embd=32, n_layer=2, n_head=2,
                                   resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=249,
                                   eos_token_id=249)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(conf).eval()
    with torch.no_grad():
        for p in model.parameters():  # biases and LayerNorms too, so any mis-mapped tensor shows in the logits
            p.add_(torch.randn_like(p) * 0.1)
    folder = tmp_path_factory.mktemp("hf") / "gpt2"
    model.save_pretrained(folder, max_shard_size="20KB")
    assert len(list(folder.glob("model-*.safetensors"))) > 1
    return folder, model


def test_sharded_hf_gpt2_gives_the_same_logits(hf_gpt2):
    folder, hf = hf_gpt2
    cfg = compose_config(GPT2_SMALL)
    source = inspect_pretrained(folder, cfg.model)
    assert source.format == "hf-gpt2" and len(source.files) > 1
    model = GPT(GPTArgs.from_config(cfg.model)).eval()
    result = model.load_state_dict(source.load(cfg.model), strict=False)
    assert result.missing_keys == ["head.weight"] and not result.unexpected_keys  # the tied head: embed.tok
    ids = torch.randint(0, 250, (2, 32), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours, theirs = model(ids)[..., :250], hf(ids).logits
    assert ours.abs().max() > 1.0
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=0)
    params = sum(p.numel() for p in hf.parameters())  # tied: wte counted once; no padding rows
    assert source.describe() == (f"model.init_from: loaded {len(dict(model.named_parameters()))} tensors "
                                 f"({params:,} parameters) from {folder} (HF GPT-2, {len(source.files)} files)")


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


def test_the_check_reads_headers_only(hf_gpt2, monkeypatch):
    """inspect_pretrained (the launcher's check) reads no tensor data; load reads each tensor once."""
    import llmtrain.checkpoint.safetensors_io as io

    folder, _ = hf_gpt2
    reads: list[str] = []

    class Counting:
        def __init__(self, handle):
            self.handle = handle

        def __enter__(self):
            self.handle.__enter__()
            return self

        def __exit__(self, *exc):
            return self.handle.__exit__(*exc)

        def get_tensor(self, name):
            reads.append(name)
            return self.handle.get_tensor(name)

        def __getattr__(self, name):  # keys, metadata, get_slice (shape and dtype from the header)
            return getattr(self.handle, name)

    real = io.safe_open
    monkeypatch.setattr(io, "safe_open", lambda *a, **k: Counting(real(*a, **k)))
    cfg = compose_config(GPT2_SMALL)
    source = inspect_pretrained(folder, cfg.model)
    assert reads == []
    source.load(cfg.model)
    assert len(reads) == len(set(reads)) == 2 + 2 * 12 + 2  # wte, wpe; 12 a layer (c_attn read once); ln_f
    assert set(reads) == {piece.key for piece in source.pieces.values()}
