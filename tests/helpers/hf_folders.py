"""Hugging Face model folders (GPT-2 and Llama shaped, tiny) saved once per module by transformers, and the llmtrain overrides that match them."""

from __future__ import annotations

import pytest
import torch


def saved_in_shards(model, tmp_path_factory, name: str, shard_size: str):
    """`model` with every parameter moved off its init (biases, norm gains too, so any mis-mapped tensor shows in
    the logits), saved by transformers in several shards; (folder, model)."""
    model.eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    folder = tmp_path_factory.mktemp("hf") / name
    model.save_pretrained(folder, max_shard_size=shard_size)
    assert len(list(folder.glob("model-*.safetensors"))) > 1
    return folder, model


transformers = pytest.importorskip("transformers", reason="transformers not installed: pip install transformers")


GPT2_SMALL = ["model.n_layers=2", "model.d_model=32", "model.n_heads=2", "model.seq_len=32", "model.vocab_size=250"]


@pytest.fixture(scope="module")
def hf_gpt2(tmp_path_factory):
    """A random GPT2LMHeadModel made by transformers, saved in shards."""
    conf = transformers.GPT2Config(vocab_size=250, n_positions=64, n_embd=32, n_layer=2, n_head=2,
                                   resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=249,
                                   eos_token_id=249)
    torch.manual_seed(0)
    return saved_in_shards(transformers.GPT2LMHeadModel(conf), tmp_path_factory, "gpt2", "20KB")


# llama-tiny with a smaller vocabulary (padded 250 -> 256) and Llama 3.1's rope scaling, strong enough to matter at
# these lengths (original context 32), so any mistake in the frequencies shows in the logits.
LLAMA = ["model=llama-tiny", "model.n_layers=2", "model.d_model=64", "model.n_heads=4", "model.n_kv_heads=2",
         "model.seq_len=64", "model.vocab_size=250", "model.ffn_dim=96", "model.rope_theta=500000",
         "model.rope_scaling={factor:8.0,low_freq_factor:1.0,high_freq_factor:4.0,"
         "original_max_position_embeddings:32}"]


@pytest.fixture(scope="module")
def hf_llama(tmp_path_factory):
    """A random LlamaForCausalLM made by transformers (GQA, llama3 rope scaling, untied), saved in shards."""
    conf = transformers.LlamaConfig(
        vocab_size=250, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5, tie_word_embeddings=False,
        rope_theta=500000.0, bos_token_id=0, eos_token_id=1,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 32})
    torch.manual_seed(0)
    return saved_in_shards(transformers.LlamaForCausalLM(conf), tmp_path_factory, "llama", "40KB")
