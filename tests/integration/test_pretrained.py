"""model.init_from: Hugging Face GPT-2 and Llama folders (single or sharded safetensors) and llmtrain exports,
checked against the config before launch from the files' headers, and loaded with the same logits."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from helpers.random_checkpoint import save_random_checkpoint
from helpers.hf_folders import GPT2_SMALL, hf_gpt2, hf_llama, LLAMA, transformers  # noqa: F401

from llmtrain.checkpoint.pretrained import inspect_pretrained, load_pretrained
from llmtrain.config import compose_config
from llmtrain.model import GPT, GPTArgs


def test_sharded_hf_gpt2_gives_the_same_logits(hf_gpt2):
    folder, hf = hf_gpt2
    cfg = compose_config(GPT2_SMALL)
    source = inspect_pretrained(folder, cfg.model)
    assert source.format == "hf-gpt2" and len(source.files) > 1
    model = GPT(GPTArgs.from_config(cfg.model)).eval()
    result = model.load_state_dict(source.load(), strict=False)
    assert result.missing_keys == ["head.weight"] and not result.unexpected_keys  # the tied head: embed.tok
    ids = torch.randint(0, 250, (2, 32), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours, theirs = model(ids)[..., :250], hf(ids).logits
    assert ours.abs().max() > 1.0
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=0)
    from llmtrain.model import init_parameters

    one_at_a_time = GPT(GPTArgs.from_config(cfg.model))  # as the workers read it: by name, one tensor at a time
    init_parameters(one_at_a_time, 0, 0.02, 2, source)
    assert all(torch.equal(p, dict(model.named_parameters())[n]) for n, p in one_at_a_time.named_parameters())
    params = sum(p.numel() for p in hf.parameters())  # tied: wte counted once; no padding rows
    assert source.describe() == (f"model.init_from: loaded {len(dict(model.named_parameters()))} tensors "
                                 f"({params:,} parameters) from {folder} (HF GPT-2, {len(source.files)} files)")


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
    source.load()
    assert len(reads) == len(set(reads)) == 2 + 2 * 12 + 2  # wte, wpe; 12 a layer (c_attn read once); ln_f
    assert set(reads) == {piece.key for pieces in source.pieces.values() for piece in pieces}


# ---- Llama ---------------------------------------------------------------------------------------------------


def llama_checkpoint(path: Path, *overrides: str):
    """A DCP checkpoint of a random llmtrain Llama (norm gains too) like the trainer's, with config.yaml."""
    return save_random_checkpoint(path, compose_config([*LLAMA, *overrides]), step=3, matrix_std=0.2)


@pytest.mark.parametrize("tie", [True, False])
def test_llama_export_loads_in_transformers_and_round_trips_exactly(tie, tmp_path):
    from llmtrain.checkpoint.export import export_checkpoint
    from llmtrain.checkpoint.safetensors_io import read_safetensors
    from llmtrain.model import build_model

    model, cfg = llama_checkpoint(tmp_path / "ck", f"model.tie_embeddings={str(tie).lower()}")
    out = tmp_path / "hf"
    summary = export_checkpoint(tmp_path / "ck", "hf", out)
    assert summary["kind"] == "Hugging Face Llama folder"
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    conf = json.loads((out / "config.json").read_text())
    assert conf["architectures"] == ["LlamaForCausalLM"] and conf["model_type"] == "llama"
    assert {k: conf[k] for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                                 "num_attention_heads", "num_key_value_heads", "head_dim", "rms_norm_eps",
                                 "rope_theta", "tie_word_embeddings")} == \
        {"vocab_size": 250, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "rms_norm_eps": 1e-5,
         "rope_theta": 500000.0, "tie_word_embeddings": tie}
    assert conf["rope_scaling"] == {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                    "high_freq_factor": 4.0, "original_max_position_embeddings": 32}
    sd = read_safetensors(out / "model.safetensors")
    assert sd["model.embed_tokens.weight"].shape == (250, 64)
    assert sd["model.layers.1.self_attn.k_proj.weight"].shape == (32, 64)
    assert ("lm_head.weight" in sd) is (not tie) and (tie or sd["lm_head.weight"].shape == (250, 64))
    assert summary["num_params"] == sum(t.numel() for t in sd.values())

    hf = transformers.LlamaForCausalLM.from_pretrained(str(out), local_files_only=True).eval()
    assert hf.config.rope_parameters["rope_type"] == "llama3" and hf.config.rope_parameters["factor"] == 8.0
    ids = torch.randint(0, 250, (2, 64), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ours, theirs = model(ids)[..., :250], hf(ids).logits.float()
    assert ours.abs().max() > 1.0
    torch.testing.assert_close(theirs, ours, atol=1e-4, rtol=0)

    # export -> init_from is exact, bit for bit in fp32; the padding rows come back as zeros.
    back = load_pretrained(out, cfg.model)
    params = {n: p.detach() for n, p in model.named_parameters()}
    assert list(back) == list(params)
    for name, t in back.items():
        if name in ("embed.tok.weight", "head.weight"):
            assert t.shape == (256, 64) and torch.count_nonzero(t[250:]) == 0
            t, want = t[:250], params[name][:250]
        else:
            want = params[name]
        assert t.dtype == torch.float32 and torch.equal(t.view(torch.int32), want.view(torch.int32)), name
    fresh = build_model(cfg.model).eval()
    fresh.load_state_dict(back, strict=False)
    with torch.no_grad():
        assert torch.equal(fresh(ids)[..., :250], ours)


def test_sharded_hf_llama_gives_the_same_logits(hf_llama):
    from llmtrain.model import build_model

    folder, hf = hf_llama
    cfg = compose_config([*LLAMA, "model.tie_embeddings=false"])
    source = inspect_pretrained(folder, cfg.model)
    assert source.format == "hf-llama" and len(source.files) > 1
    model = build_model(cfg.model).eval()
    result = model.load_state_dict(source.load(), strict=False)
    assert not result.missing_keys and not result.unexpected_keys
    ids = torch.randint(0, 250, (2, 64), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours, theirs = model(ids)[..., :250], hf(ids).logits
    assert ours.abs().max() > 1.0
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=0)
    # What the workers do: init_parameters reads each tensor on its own, by name, and gets the same values.
    from llmtrain.model import init_parameters

    one_at_a_time = build_model(cfg.model)
    init_parameters(one_at_a_time, 0, 0.02, 2, source)
    assert all(torch.equal(p, dict(model.named_parameters())[n]) for n, p in one_at_a_time.named_parameters())
    params = sum(p.numel() for p in hf.parameters())
    assert source.describe() == (f"model.init_from: loaded {2 + 9 * 2 + 1} tensors ({params:,} parameters) from "
                                 f"{folder} (HF Llama, {len(source.files)} files)")


# ---- docs/models.md's command against a folder shaped like Meta's Llama 3.2 1B ------------------------------------

# config.json of meta-llama/Llama-3.2-1B as published.
LLAMA32_1B = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 128000,
    "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
    "intermediate_size": 8192, "max_position_embeddings": 131072, "mlp_bias": False, "model_type": "llama",
    "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8, "pretraining_tp": 1,
    "rms_norm_eps": 1e-05, "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                                            "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": True, "torch_dtype": "bfloat16", "use_cache": True,
    "vocab_size": 128256}


def sparse_safetensors(path: Path, shapes: dict[str, list[int]], dtype: str = "BF16") -> None:
    """A safetensors file with these tensors whose data is a hole (a sparse file): its header is real, its
    2.5 GB of bf16 take no disk. Written by hand because the point is not to materialize the tensors."""
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, shape in shapes.items():
        size = 2 * math.prod(shape)
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(len(raw).to_bytes(8, "little") + raw)
        f.truncate(8 + len(raw) + offset)


def llama32_1b_folder(folder: Path) -> None:
    d, kv, ffn = 2048, 8 * 64, 8192
    shapes = {"model.embed_tokens.weight": [128256, d], "model.norm.weight": [d]}
    for i in range(16):
        p = f"model.layers.{i}."
        shapes.update({p + "input_layernorm.weight": [d], p + "post_attention_layernorm.weight": [d],
                       p + "self_attn.q_proj.weight": [d, d], p + "self_attn.k_proj.weight": [kv, d],
                       p + "self_attn.v_proj.weight": [kv, d], p + "self_attn.o_proj.weight": [d, d],
                       p + "mlp.gate_proj.weight": [ffn, d], p + "mlp.up_proj.weight": [ffn, d],
                       p + "mlp.down_proj.weight": [d, ffn]})
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(LLAMA32_1B))
    sparse_safetensors(folder / "model.safetensors", shapes)


def test_readme_continue_pretraining_command_passes_the_check(tmp_path, capsys, monkeypatch):
    """docs/models.md's `llmtrain launch model=llama3-1b model.init_from=Llama-3.2-1B ...` (as a dry run) against a
    folder with Llama 3.2 1B's published config.json and tensor names and shapes: llama3-1b matches it."""
    import re
    import shlex

    from conftest import REPO
    from llmtrain.cli import main

    llama32_1b_folder(tmp_path / "Llama-3.2-1B")
    (tmp_path / "data").mkdir()
    tokens = 200_000  # uint32 ids of Llama 3's vocabulary: room for a sequence of 8193 in each split
    with open(tmp_path / "data" / "llama.bin", "wb") as f:
        f.truncate(4 * tokens)
    (tmp_path / "data" / "llama.bin.json").write_text(json.dumps(
        {"format": "llmtrain-tokens-v1", "dtype": "uint32", "vocab_size": 128256, "num_tokens": tokens}))
    readme = (REPO / "docs" / "models.md").read_text()
    commands = [ln.strip() for ln in re.findall(r"^llmtrain launch .*model\.init_from=.*$", readme, re.M)]
    assert len(commands) == 1
    monkeypatch.chdir(tmp_path)
    args = shlex.split(commands[0])[1:]
    # This machine is no GPU node: its memory is not what the command is sized for.
    assert main([args[0], "--dry-run", *args[1:], "launch.max_memory_ratio=null"]) == 0, capsys.readouterr().err
    assert "  init_from: Llama-3.2-1B\n" in capsys.readouterr().out

    cfg = compose_config([a for a in args[1:] if "=" in a])
    source = inspect_pretrained("Llama-3.2-1B", cfg.model)
    line = f"llmtrain: {source.describe()}"
    assert line == "llmtrain: model.init_from: loaded 146 tensors (1,235,814,400 parameters) from Llama-3.2-1B " \
                   "(HF Llama)"
    assert f"`{line}`" in readme
    # docs/models.md's example refusals, as they are.
    for override in ("model.n_kv_heads=32", "model.rope_theta=10000"):
        assert main(["launch", "--dry-run", *args[1:], "launch.max_memory_ratio=null", override]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("llmtrain: error: model.init_from: ") and f"\n{err}\n" in readme, err
