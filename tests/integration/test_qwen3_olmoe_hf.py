"""Qwen3 (dense and mixture of experts) and OLMoE against transformers, in fp32 and in-process: a Hugging Face
folder loads through model.init_from with transformers' logits, an export loads in transformers with ours and comes
back bit for bit, and a folder the config cannot hold is refused before launch in one line."""

from __future__ import annotations

import json
import math
import re
import shlex
from pathlib import Path

import pytest
import torch
from conftest import REPO
from helpers.hf_folders import saved_in_shards, transformers
from helpers.random_checkpoint import save_random_checkpoint

from llmtrain.checkpoint.export import export_checkpoint
from llmtrain.checkpoint.pretrained import inspect_pretrained, load_pretrained
from llmtrain.config import ConfigError, compose_config
from llmtrain.model import build_model, init_parameters

VOCAB = 250  # padded to 256 rows by llmtrain
# Per family: llmtrain's overrides, and the transformers config of the same model. Every HF model has some layers
# more than one expert width and head shape, so a mis-mapped tensor or routing shows in the logits.
QWEN3 = ["model=qwen3-0.6b", "model.n_layers=2", "model.d_model=64", "model.n_heads=4", "model.n_kv_heads=2",
         "model.head_dim=32", "model.ffn_dim=96", f"model.vocab_size={VOCAB}", "model.seq_len=64"]
QWEN3_MOE = ["model=moe-tiny", "model.n_layers=3", "model.d_model=64", "model.head_dim=16", "model.ffn_dim=96",
             f"model.vocab_size={VOCAB}", "model.seq_len=64", "model.moe.expert_ffn_dim=32",
             "model.moe.n_shared_experts=0", "model.tie_embeddings=false"]
OLMOE = ["model=olmoe-1b-7b", "model.n_layers=2", "model.d_model=64", "model.n_heads=4", "model.n_kv_heads=2",
         "model.ffn_dim=32", f"model.vocab_size={VOCAB}", "model.seq_len=64", "model.moe.n_experts=8",
         "model.moe.top_k=2", "model.moe.expert_ffn_dim=32"]
COMMON = dict(vocab_size=VOCAB, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=64, bos_token_id=0, eos_token_id=1, pad_token_id=None)
FAMILIES = {
    "qwen3": (QWEN3, "Qwen3Config", "Qwen3ForCausalLM",
              dict(COMMON, intermediate_size=96, num_hidden_layers=2, head_dim=32, rms_norm_eps=1e-6,
                   rope_theta=1e6, tie_word_embeddings=True)),
    "qwen3_moe": (QWEN3_MOE, "Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                  dict(COMMON, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=3, head_dim=16,
                       num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, mlp_only_layers=[0],
                       decoder_sparse_step=1, rms_norm_eps=1e-6, rope_theta=1e6, tie_word_embeddings=False)),
    "olmoe": (OLMOE, "OlmoeConfig", "OlmoeForCausalLM",
              dict(COMMON, intermediate_size=32, num_hidden_layers=2, num_experts=8, num_experts_per_tok=2,
                   norm_topk_prob=False, rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False)),
}
IDS = torch.randint(0, VOCAB, (2, 64), generator=torch.Generator().manual_seed(1))


@pytest.fixture(scope="module")
def hf_folders(tmp_path_factory):
    """{family: (folder, model)}: random transformers models, every weight moved off its init, saved in shards."""
    out = {}
    for name, (_, config_class, model_class, kwargs) in FAMILIES.items():
        torch.manual_seed(0)
        model = getattr(transformers, model_class)(getattr(transformers, config_class)(**kwargs))
        out[name] = saved_in_shards(model, tmp_path_factory, name, "60KB")
    return out


def logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(IDS)[..., :VOCAB]


@pytest.mark.parametrize("name", FAMILIES)
def test_hf_folder_loads_with_transformers_logits(name, hf_folders):
    folder, hf = hf_folders[name]
    overrides, *_ = FAMILIES[name]
    cfg = compose_config(overrides)
    source = inspect_pretrained(folder, cfg.model)
    assert source.format == f"hf-{cfg.model.arch}" and len(source.files) > 1
    model = build_model(cfg.model).eval()
    init_parameters(model, 0, 0.02, cfg.model.n_layers, source)  # what each worker does: one tensor at a time
    with torch.no_grad():
        theirs = hf(IDS).logits
    ours = logits(model)
    assert ours.abs().max() > 1.0
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=0)
    params = sum(p.numel() for p in hf.parameters())
    assert f"({params:,} parameters)" in source.describe()


@pytest.mark.parametrize("name", FAMILIES)
def test_export_loads_in_transformers_and_round_trips_exactly(name, tmp_path):
    overrides, _, model_class, kwargs = FAMILIES[name]
    model, cfg = save_random_checkpoint(tmp_path / "ck", compose_config(overrides), step=3, matrix_std=0.2)
    out = tmp_path / "hf"
    summary = export_checkpoint(tmp_path / "ck", "hf", out)
    conf = json.loads((out / "config.json").read_text())
    assert conf["architectures"] == [model_class]
    theirs_conf = getattr(transformers, FAMILIES[name][1])(**kwargs)
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "rms_norm_eps", "tie_word_embeddings", "num_experts_per_tok",
                "moe_intermediate_size", "norm_topk_prob", "mlp_only_layers", "decoder_sparse_step"):
        if hasattr(theirs_conf, key):
            assert conf[key] == getattr(theirs_conf, key), key

    hf = getattr(transformers, model_class).from_pretrained(str(out), local_files_only=True).eval()
    assert sum(p.numel() for p in hf.parameters()) == summary["num_params"]
    with torch.no_grad():
        theirs = hf(IDS).logits.float()
    ours = logits(model)
    assert ours.abs().max() > 1.0
    torch.testing.assert_close(theirs, ours, atol=1e-4, rtol=0)

    # export -> init_from is exact, bit for bit in fp32; the padding rows come back as zeros.
    back = load_pretrained(out, cfg.model)
    params = {n: p.detach() for n, p in model.named_parameters()}
    assert sorted(back) == sorted(params)
    for n, t in back.items():
        want = params[n]
        if n in ("embed.tok.weight", "head.weight"):
            assert torch.count_nonzero(t[VOCAB:]) == 0
            t, want = t[:VOCAB], want[:VOCAB]
        assert t.dtype == torch.float32 and torch.equal(t.view(torch.int32), want.view(torch.int32)), n


def test_moe_folder_with_other_expert_width_or_routing_is_refused_in_one_line(hf_folders):
    folder, _ = hf_folders["qwen3_moe"]
    with pytest.raises(ConfigError) as e:
        inspect_pretrained(folder, compose_config([*QWEN3_MOE, "model.moe.expert_ffn_dim=48"]).model)
    assert e.value.key == "model.init_from" and re.fullmatch(
        rf"model\.layers\.1\.mlp\.experts\.0\.gate_proj\.weight \(expert 0 of layers\.1\.mlp\.experts\.gate\) is "
        rf"\[32, 64\] in {re.escape(str(folder))}/model-\d+-of-\d+\.safetensors but the config builds \[48, 64\] per "
        rf"expert \(model\.moe\.expert_ffn_dim\)", e.value.message), e.value.message
    with pytest.raises(ConfigError) as e:
        inspect_pretrained(folder, compose_config([*QWEN3_MOE, "model.moe.top_k=4"]).model)
    assert e.value.message == (f"{folder / 'config.json'} has num_experts_per_tok=2 but model.moe.top_k=4; set "
                               f"model.moe.top_k=2")
    with pytest.raises(ConfigError) as e:
        inspect_pretrained(folder, compose_config([*QWEN3_MOE, "model.moe.norm_topk_prob=false"]).model)
    assert e.value.message.endswith("has norm_topk_prob=true but model.moe.norm_topk_prob=False; set "
                                    "model.moe.norm_topk_prob=true")


# ---- docs/models.md's commands, against a folder shaped like Qwen/Qwen3-30B-A3B -----------------------------------

# config.json of Qwen/Qwen3-30B-A3B as published.
QWEN3_30B_A3B = {
    "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 6144, "max_position_embeddings": 40960,
    "max_window_layers": 48, "mlp_only_layers": [], "model_type": "qwen3_moe", "moe_intermediate_size": 768,
    "norm_topk_prob": True, "num_attention_heads": 32, "num_experts": 128, "num_experts_per_tok": 8,
    "num_hidden_layers": 48, "num_key_value_heads": 4, "output_router_logits": False, "rms_norm_eps": 1e-06,
    "rope_scaling": None, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001, "sliding_window": None,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.51.0", "use_cache": True,
    "use_sliding_window": False, "vocab_size": 151936}


def sparse_shard(path: Path, shapes: dict[str, list[int]]) -> None:
    """A bf16 safetensors file whose data is a hole (a sparse file): a real header, no disk for the tensors."""
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, shape in shapes.items():
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + 2 * math.prod(shape)]}
        offset += 2 * math.prod(shape)
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(len(raw).to_bytes(8, "little") + raw)
        f.truncate(8 + len(raw) + offset)


def qwen3_30b_a3b_folder(folder: Path, shards: int = 16) -> None:
    """Published names and shapes (one tensor per expert matrix) in `shards` sparse files with their index."""
    d, q, kv, experts, f, vocab = 2048, 32 * 128, 4 * 128, 128, 768, 151936
    shapes = {"model.embed_tokens.weight": [vocab, d], "model.norm.weight": [d], "lm_head.weight": [vocab, d]}
    for i in range(48):
        p = f"model.layers.{i}."
        shapes.update({p + "input_layernorm.weight": [d], p + "post_attention_layernorm.weight": [d],
                       p + "self_attn.q_proj.weight": [q, d], p + "self_attn.k_proj.weight": [kv, d],
                       p + "self_attn.v_proj.weight": [kv, d], p + "self_attn.o_proj.weight": [d, q],
                       p + "self_attn.q_norm.weight": [128], p + "self_attn.k_norm.weight": [128],
                       p + "mlp.gate.weight": [experts, d]})
        for j in range(experts):
            shapes.update({f"{p}mlp.experts.{j}.gate_proj.weight": [f, d], f"{p}mlp.experts.{j}.up_proj.weight": [f, d],
                           f"{p}mlp.experts.{j}.down_proj.weight": [d, f]})
    total, done, weight_map = 2 * sum(math.prod(s) for s in shapes.values()), 0, {}
    for name, shape in shapes.items():
        weight_map[name] = f"model-{min(shards, done * shards // total + 1):05d}-of-{shards:05d}.safetensors"
        done += 2 * math.prod(shape)
    folder.mkdir()
    for file in sorted(set(weight_map.values())):
        sparse_shard(folder / file, {n: s for n, s in shapes.items() if weight_map[n] == file})
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total},
                                                                     "weight_map": weight_map}))
    (folder / "config.json").write_text(json.dumps(QWEN3_30B_A3B))


def docs_section(title: str) -> str:
    text = (REPO / "docs" / "models.md").read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else len(text)]


def test_docs_continue_pretraining_command_passes_the_check(tmp_path, capsys, monkeypatch):
    """docs/models.md's Qwen3-MoE command (as a dry run) against a folder with Qwen3-30B-A3B's published config.json,
    tensor names and shapes in 16 shards: qwen3-moe-30b-a3b matches it, and the page's lines are what runs print."""
    from llmtrain.cli import main

    qwen3_30b_a3b_folder(tmp_path / "Qwen3-30B-A3B")
    (tmp_path / "data").mkdir()
    tokens = 200_000  # uint32 ids of Qwen3's tokenizer: room for a sequence of 4097 in each split
    with open(tmp_path / "data" / "qwen3.bin", "wb") as f:
        f.truncate(4 * tokens)
    (tmp_path / "data" / "qwen3.bin.json").write_text(json.dumps(
        {"format": "llmtrain-tokens-v1", "dtype": "uint32", "vocab_size": 151669, "num_tokens": tokens}))
    section = docs_section("Continue pretraining from a Hugging Face Qwen3 / Qwen3-MoE folder")
    commands = [c for c in section.replace("\\\n", " ").splitlines() if c.startswith("llmtrain launch ")]
    assert len(commands) == 1
    monkeypatch.chdir(tmp_path)
    args = shlex.split(commands[0])[1:]
    # This machine is no GPU node: its memory is not what the command is sized for.
    assert main([args[0], "--dry-run", *args[1:], "launch.max_memory_ratio=null"]) == 0, capsys.readouterr().err
    assert "  init_from: Qwen3-30B-A3B\n" in capsys.readouterr().out

    cfg = compose_config([a for a in args[1:] if "=" in a])
    line = f"llmtrain: {inspect_pretrained('Qwen3-30B-A3B', cfg.model).describe()}"
    assert f"\n{line}\n" in section, line
    assert main(["launch", "--dry-run", *args[1:], "launch.max_memory_ratio=null", "model.moe.top_k=4"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("llmtrain: error: model.init_from: ") and f"\n{err}\n" in section, err


def test_docs_olmoe_refusals_are_what_the_launcher_prints(capsys):
    from llmtrain.cli import main

    examples = re.findall(r"^\$ llmtrain (launch .*)\n(llmtrain: error: .*)$", docs_section("OLMoE"), re.M)
    assert len(examples) == 2
    for command, printed in examples:
        assert main(shlex.split(command)) == 2
        assert capsys.readouterr().err.strip() == printed


def test_docs_export_refusal_of_a_shared_expert_is_what_the_cli_prints(tmp_path, capsys):
    from llmtrain.cli import main

    save_random_checkpoint(tmp_path / "ck", compose_config(["model=moe-tiny"]), step=1, matrix_std=0.2)
    assert main(["ckpt", "export", str(tmp_path / "ck"), "--format", "hf", "--out", str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("llmtrain: error: --format: ") and f"\n{err}\n" in docs_section("Qwen3"), err
    assert not (tmp_path / "hf").exists()
