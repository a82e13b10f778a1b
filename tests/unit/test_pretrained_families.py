"""The checkpoint side asks the model family, never its name: which family's Hugging Face names a folder holds
(config.json's model_type, else the names, the configured family first among those that recognize them), and which
keys fix a checkpoint's shapes (seq_len only with a position table; model.moe's sizes)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.random_checkpoint import save_random_checkpoint

from llmtrain.checkpoint import pretrained
from llmtrain.checkpoint.diff import check_resumable
from llmtrain.checkpoint.export import export_checkpoint
from llmtrain.checkpoint.pretrained import inspect_pretrained
from llmtrain.checkpoint.safetensors_io import read_safetensors_metadata
from llmtrain.checkpoint.store import CheckpointError
from llmtrain.config import ConfigError, compose_config
from llmtrain.model.family import FamilySpec
from llmtrain.model.registry import family

LLAMA = ["model=llama-tiny", "model.n_layers=1", "model.d_model=32", "model.n_heads=2", "model.n_kv_heads=1",
         "model.ffn_dim=48", "model.vocab_size=250", "model.seq_len=16"]


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory) -> Path:
    """A random llama exported as a Hugging Face folder."""
    tmp = tmp_path_factory.mktemp("llama")
    save_random_checkpoint(tmp / "ck", compose_config(LLAMA), step=1, matrix_std=0.2)
    export_checkpoint(tmp / "ck", "hf", tmp / "hf")
    return tmp / "hf"


def test_export_records_the_family_layout(llama_folder):
    assert read_safetensors_metadata(llama_folder / "model.safetensors")["layout"] == "hf-llama"


def _with_config(folder: Path, tmp_path: Path, conf: dict) -> Path:
    out = tmp_path / "copy"
    out.mkdir()
    (out / "model.safetensors").symlink_to(folder / "model.safetensors")
    (out / "config.json").write_text(json.dumps(conf))
    return out


def test_a_config_json_without_model_type_is_read_by_the_names(llama_folder, tmp_path):
    conf = json.loads((llama_folder / "config.json").read_text())
    del conf["model_type"]
    source = inspect_pretrained(_with_config(llama_folder, tmp_path, conf), compose_config(LLAMA).model)
    assert source.format == "hf-llama" and source.format_name == "HF Llama"


def test_an_unknown_model_type_is_one_line_naming_the_file(llama_folder, tmp_path):
    folder = _with_config(llama_folder, tmp_path, {"model_type": "mistral"})
    with pytest.raises(ConfigError) as e:
        inspect_pretrained(folder, compose_config(LLAMA).model)
    known = ", ".join(t for arch in ("gpt2", "llama") for t in family(arch).hf_model_types)
    assert e.value.key == "model.init_from"
    assert e.value.message.startswith(f"{folder / 'config.json'}: model_type 'mistral' is not one llmtrain reads (")
    assert known in e.value.message


def test_a_bare_weights_file_is_read_by_the_configured_family_among_those_that_know_its_names(monkeypatch):
    """Llama-like families share Hugging Face names: without config.json the configured one reads them."""
    llama = family("llama")

    class Twin(FamilySpec):
        name, title, hf = "twin", "Twin", "llmtrain.model.llama.hf"

    twin = Twin()
    specs = {"gpt2": family("gpt2"), "llama": llama, "twin": twin}
    monkeypatch.setattr(pretrained, "FAMILIES", tuple(specs))
    monkeypatch.setattr(pretrained, "family", specs.__getitem__)
    keys = ["model.embed_tokens.weight", "model.norm.weight"]
    for arch, want in (("twin", twin), ("llama", llama), ("gpt2", llama)):
        monkeypatch.setattr(pretrained, "family_of", lambda m, a=arch: specs[a])
        assert pretrained._source_family(keys, None, Path("w.safetensors"), None) is want, arch
    assert pretrained._source_family(["transformer.wte.weight"], None, Path("w"), None) is family("gpt2")
    assert pretrained._source_family(["embed.tok.weight"], None, Path("w"), None) is None  # llmtrain names
    with pytest.raises(ConfigError, match=r"^model.init_from: w: neither llmtrain names \(embed.tok.weight\) nor "
                                          r"the Hugging Face names of a family llmtrain reads \(GPT-2, Llama, Twin\)"):
        pretrained._source_family(["x"], None, Path("w"), None)


MOE = "model.moe={n_experts:4,top_k:2,expert_ffn_dim:8}"


def test_model_moe_sizes_fix_the_checkpoint_shapes_and_its_routing_does_not():
    saved = compose_config([*LLAMA, MOE])
    assert check_resumable(saved, compose_config([*LLAMA, MOE, "model.moe.top_k=1"]), "ckpt") == \
        [("model.moe.top_k", 2, 1)]
    with pytest.raises(CheckpointError, match=r"model.moe.n_experts 4 -> 8 "):
        check_resumable(saved, compose_config([*LLAMA, MOE, "model.moe.n_experts=8"]), "ckpt")
    with pytest.raises(CheckpointError, match=r"model.moe.expert_ffn_dim 8 -> 16 "):
        check_resumable(saved, compose_config([*LLAMA, MOE, "model.moe.expert_ffn_dim=16"]), "ckpt")
    with pytest.raises(CheckpointError, match=r"model.moe None -> <absent>"):  # a dense run cannot resume as MoE
        check_resumable(compose_config(LLAMA), saved, "ckpt")


def test_seq_len_is_fixed_only_by_a_position_table():
    assert family("gpt2").learned_positions and not family("llama").learned_positions
    assert check_resumable(compose_config(LLAMA), compose_config([*LLAMA, "model.seq_len=32"]), "c") == \
        [("model.seq_len", 16, 32)]
    with pytest.raises(CheckpointError, match=r"model.seq_len 128 -> 256"):
        check_resumable(compose_config([]), compose_config(["model.seq_len=256"]), "c")
