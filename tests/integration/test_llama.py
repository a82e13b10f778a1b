"""The Llama family in-process: config keys and their refusals, the model against transformers' Llama, and the
layout-independent init of its new parameters and buffers. No processes (see test_parallel.py for the layouts)."""

from __future__ import annotations

import pytest
import torch

from llmtrain.cli import main
from llmtrain.config import compose_config
from llmtrain.config.derived import ffn_dim
from llmtrain.config.schema import RopeScalingConfig
from llmtrain.model import GPT, Llama, LlamaArgs, build_model, init_parameters

TINY = ["model=llama-tiny"]


def refusal(capsys, *overrides: str) -> str:
    assert main(["config", *overrides]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err  # one line
    return err.removeprefix("llmtrain: error: ").strip()


@pytest.mark.parametrize("overrides,line", [
    ([*TINY, "model.n_heads=32", "model.d_model=256", "model.n_kv_heads=6"],
     "model.n_kv_heads: n_heads=32 must be divisible by n_kv_heads=6"),
    ([*TINY, "model.n_kv_heads=2", "parallel.tp=4", "cluster.nproc_per_node=4"],
     "model.n_kv_heads: 2 kv heads cannot be split over parallel.tp=4; use a tp that divides n_kv_heads"),
    ([*TINY, "model.head_dim=33"], "model.head_dim: rotary positions pair a head's dimensions, so the head width "
                                   "must be even (got 33)"),
    ([*TINY, "model.n_heads=8", "model.d_model=120", "model.n_kv_heads=null"],
     "model.head_dim: rotary positions pair a head's dimensions, so the head width must be even "
     "(got 15 = d_model 120 / n_heads 8)"),
    ([*TINY, "model.dropout=0.1"], "model.dropout: is a model.arch=gpt2 setting and this model is model.arch=llama; "
                                   "remove it (default 0.0) or set model.arch=gpt2"),
    (["model.n_kv_heads=2"], "model.n_kv_heads: is a model.arch=llama setting and this model is model.arch=gpt2; "
                             "remove it (default None) or set model.arch=llama"),
    (["model.tie_embeddings=false"], "model.tie_embeddings: is a model.arch=llama setting"),
    (["model.rope_theta=500000"], "model.rope_theta: is a model.arch=llama setting"),
    (["model.arch=mamba"], "model.arch: must be one of gpt2, llama, qwen3, olmoe (got mamba)"),
    ([*TINY, "model.ffn_dim=100", "parallel.tp=8", "cluster.nproc_per_node=8", "model.n_heads=8",
      "model.n_kv_heads=8"], "parallel.tp: tp=8 must divide the MLP width 100 (model.ffn_dim)"),
    ([*TINY, "model.rope_scaling.factor=8"], "model.rope_scaling.factor: model.rope_scaling is null here; set the "
                                             "section whole: model.rope_scaling={factor:...}"),
    (["model=llama3-8b", "model.rope_scaling.fctor=8"], "model.rope_scaling.fctor: unknown key"),
    ([*TINY, "model.rope_scaling={factor:8,high_freq_factor:1}"],
     "model.rope_scaling.high_freq_factor: must exceed low_freq_factor=1.0 (got 1.0)"),
])
def test_bad_llama_settings_are_refused_in_one_line(overrides, line, capsys):
    assert refusal(capsys, *overrides).startswith(line)


def test_ffn_dim_follows_llamas_formula_and_an_explicit_value_wins():
    cfg = compose_config(["model=llama-tiny", "model.d_model=4096", "model.n_heads=32", "model.ffn_dim_multiplier=1.3",
                          "model.multiple_of=1024"])
    assert ffn_dim(cfg.model) == 14336  # int(1.3 x int(2 x 16384 / 3)) = 14198 -> 14 x 1024
    cfg = compose_config(["model=llama-tiny", "model.ffn_dim=200"])
    assert ffn_dim(cfg.model) == 200
    assert ffn_dim(compose_config([]).model) == 512  # gpt2: 4 x d_model


def _hf_pair(tie: bool):
    """llmtrain's Llama and transformers' LlamaForCausalLM with the same weights (llama3 rope scaling, GQA)."""
    transformers = pytest.importorskip("transformers")
    scaling = dict(factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=64)
    ours = Llama(LlamaArgs(n_layers=2, n_heads=4, d_model=64, vocab_size=128, seq_len=256, ffn_dim=96, n_kv_heads=2,
                           rope_theta=500000.0, rope_scaling=RopeScalingConfig(**scaling), tie_embeddings=tie))
    hf_cfg = transformers.LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5, rope_theta=500000.0,
        tie_word_embeddings=tie, rope_scaling={"rope_type": "llama3", **scaling})
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(hf_cfg).eval()
    names = {"model.embed_tokens.": "embed.tok.", "model.layers.": "layers.", "model.norm.": "norm.",
             "lm_head.": "head.", "input_layernorm": "ln_1", "post_attention_layernorm": "ln_2",
             "self_attn.q_proj": "attn.q", "self_attn.k_proj": "attn.k", "self_attn.v_proj": "attn.v",
             "self_attn.o_proj": "attn.proj", "mlp.gate_proj": "mlp.gate", "mlp.up_proj": "mlp.fc",
             "mlp.down_proj": "mlp.proj"}
    state = {}
    for key, value in hf.state_dict().items():
        for a, b in names.items():
            key = key.replace(a, b)
        state[key] = value
    if tie:  # transformers leaves the tied head out of its state dict; llmtrain lists it under both names
        state["head.weight"] = state["embed.tok.weight"]
    ours.load_state_dict(state, strict=True)  # the same names and shapes, no permutation of q or k
    return ours.eval(), hf


@pytest.mark.parametrize("tie", [False, True])
def test_logits_equal_transformers_llama(tie):
    ours, hf = _hf_pair(tie)
    assert torch.equal(ours.layers["0"].attn.rope.inv_freq, hf.model.rotary_emb.inv_freq)
    x = torch.randint(0, 128, (2, 200), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        diff = (ours(x) - hf(x).logits).abs().max().item()
    assert diff <= 1e-5, diff


def test_meta_built_llama_initializes_norms_to_one_and_recomputes_rotary_frequencies():
    cfg = compose_config(["model=llama-tiny", "model.tie_embeddings=false", "model.rope_scaling={factor:8}"])
    with torch.device("meta"):
        model = build_model(cfg.model)
    model.to_empty(device="cpu")
    model.layers["1"].attn.rope.inv_freq.fill_(float("nan"))
    init_parameters(model, seed=7, std=0.02, n_layers=4)
    with torch.device("cpu"):
        reference = build_model(cfg.model)
    for i in model.layers:
        assert torch.equal(model.layers[i].attn.rope.inv_freq, reference.layers[i].attn.rope.inv_freq)
    params = dict(model.named_parameters())
    assert all(torch.equal(params[n], torch.ones(128)) for n in ("layers.0.ln_1.weight", "layers.3.ln_2.weight",
                                                               "norm.weight"))
    assert not any(n.endswith(".bias") for n in params)
    # Untied: the head has its own value, not the embedding's.
    assert not torch.equal(params["head.weight"], params["embed.tok.weight"])
    assert 0.015 < params["head.weight"].std().item() < 0.025


def test_llama_parameter_names_follow_the_shared_layout():
    cfg = compose_config(["model=llama-tiny"])
    names = set(dict(build_model(cfg.model).named_parameters()))
    block = {f"layers.0.{n}.weight" for n in ("ln_1", "attn.q", "attn.k", "attn.v", "attn.proj", "ln_2", "mlp.gate",
                                              "mlp.fc", "mlp.proj")}
    assert block <= names and {"embed.tok.weight", "norm.weight"} <= names
    assert len(names) == 2 + 4 * 9  # tied: no head.weight of its own, no position table


def test_gpt2_is_unchanged():
    model = build_model(compose_config([]).model)
    assert isinstance(model, GPT)
    assert model.num_params() == 842_496
    assert "embed.pos.weight" in dict(model.named_parameters())
    assert model.layers["0"].ln_1.eps == 1e-5 and model.layers["0"].mlp.fc.out_features == 512


def test_a_llama_run_may_resume_with_another_seq_len_but_not_another_shape():
    from llmtrain.checkpoint.diff import check_resumable
    from llmtrain.checkpoint.store import CheckpointError

    saved = compose_config(["model=llama-tiny"])
    diff = check_resumable(saved, compose_config(["model=llama-tiny", "model.seq_len=256"]), "ckpt")
    assert diff == [("model.seq_len", 128, 256)]
    with pytest.raises(CheckpointError, match=r"model.n_kv_heads 2 -> 4 "):
        check_resumable(saved, compose_config(["model=llama-tiny", "model.n_kv_heads=4"]), "ckpt")
    with pytest.raises(CheckpointError, match=r"model.tie_embeddings True -> False"):
        check_resumable(saved, compose_config(["model=llama-tiny", "model.tie_embeddings=false"]), "ckpt")
    with pytest.raises(CheckpointError, match=r"model.seq_len 128 -> 256"):  # GPT-2's position table
        check_resumable(compose_config([]), compose_config(["model.seq_len=256"]), "ckpt")


# ---- fp8 (torchao float8): validation and the module swap, which run on the CPU -------------------------------

FP8_H100 = ["model=llama-tiny", "precision=fp8", "hardware=h100", "device=cuda"]


def test_fp8_validation_accepts_llama_and_checks_its_key_value_and_mlp_widths(capsys):
    from llmtrain.launch.config_probes import validate_here

    pytest.importorskip("torchao")
    validate_here(compose_config(FP8_H100))  # widths 128, 128, 64 (kv), 352 (SwiGLU)
    prefix = "precision: fp8's float8 matmuls take only dimensions that are multiples of 16, and "
    assert refusal(capsys, *FP8_H100, "model.head_dim=8", "model.n_kv_heads=1").startswith(
        prefix + "the key/value width (n_kv_heads x head_dim) is 8;")
    assert refusal(capsys, *FP8_H100, "model.ffn_dim=360").startswith(prefix + "the MLP width (model.ffn_dim) is 360;")
    # 2 kv heads of 24: 48 in all, 24 per rank (the query heads: 96 and 48)
    assert refusal(capsys, *FP8_H100, "parallel.tp=2", "cluster.nproc_per_node=2", "model.head_dim=24").startswith(
        prefix + "the key/value width per parallel.tp=2 rank is 24;")


def test_fp8_swaps_every_llama_block_linear_including_the_swiglu_gate(one_rank):
    pytest.importorskip("torchao")
    from torchao.float8.float8_linear import Float8Linear

    from llmtrain.parallel.build import build_parallel_model
    from llmtrain.parallel.layout import ParallelDims
    from llmtrain.parallel.mesh import build_mesh

    built = {}
    for precision in ("bf16", "fp8"):
        cfg = compose_config(["model=llama-tiny", "data=synthetic", "cluster.nproc_per_node=1", f"precision={precision}",
                              "model.tie_embeddings=false"])
        dims = ParallelDims.from_config(cfg)
        built[precision] = build_parallel_model(cfg, dims, build_mesh(dims, "cpu"), torch.device("cpu"))
    fp8 = built["fp8"]
    assert fp8.float8.converted == 4 * 7  # q, k, v, proj, gate, fc, proj per block
    assert isinstance(fp8.parts[0].layers["3"].mlp.gate, Float8Linear)
    assert not isinstance(fp8.parts[0].head, Float8Linear)  # the untied head stays in bf16 too
    bf16_params = dict(built["bf16"].named_parameters())
    assert [n for n, _ in fp8.named_parameters()] == list(bf16_params)
    for n, p in fp8.named_parameters():
        assert torch.equal(p, bf16_params[n]), n
