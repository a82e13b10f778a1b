"""Stacked parameters: a Hugging Face mixture-of-experts folder stores each expert's matrices on their own
(model.layers.{i}.mlp.experts.{j}.gate_proj.weight [f, d], up_proj, down_proj [d, f]); llmtrain stacks them into
layers.{i}.mlp.experts.gate [E, f, d], fc, proj [E, d, f]. Pieces with slot=j fill one row each: the export
unstacks, the pre-launch check names a missing expert or a wrong per-expert shape, the load stacks, bit for bit.

The family is a Llama with model.moe whose adapter is a synthetic one that knows expert names (the generic
machinery is under test, not a particular family's names)."""

from __future__ import annotations

import json
import re
import types

import pytest
import torch
from helpers.random_checkpoint import save_random_checkpoint

from llmtrain.checkpoint.export import export_checkpoint
from llmtrain.checkpoint.pretrained import inspect_pretrained
from llmtrain.checkpoint.safetensors_io import read_safetensors, write_safetensors
from llmtrain.config import ConfigError, compose_config
from llmtrain.model.llama import hf as llama_hf
from llmtrain.model.registry import family
from llmtrain.model.weight_pieces import Piece, unstack

TINY_MOE = ["model=llama-tiny", "model.n_layers=2", "model.d_model=32", "model.n_heads=2", "model.n_kv_heads=1",
            "model.ffn_dim=48", "model.vocab_size=250", "model.seq_len=16",
            "model.moe={n_experts:4,top_k:2,expert_ffn_dim:8,n_shared_experts:1,n_dense_layers:1}"]
EXPERTS = 4
# Inside model.layers.{i}.mlp. (HF) -> inside layers.{i}.mlp. (llmtrain)
_EXPERT_MATRICES = {"gate_proj": "gate", "up_proj": "fc", "down_proj": "proj"}
_EXPERT_KEY = re.compile(r"^model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")
_STACKED = re.compile(r"^layers\.(\d+)\.mlp\.experts\.(gate|fc|proj)$")
_OTHER = {"mlp.gate.weight": "mlp.router.weight", "mlp.shared_expert.gate_proj.weight": "mlp.shared.gate.weight",
          "mlp.shared_expert.up_proj.weight": "mlp.shared.fc.weight",
          "mlp.shared_expert.down_proj.weight": "mlp.shared.proj.weight"}


def _pieces(key: str) -> list[Piece] | None:
    m = _EXPERT_KEY.match(key)
    if m:
        layer, expert, matrix = m.groups()
        return [Piece(f"layers.{layer}.mlp.experts.{_EXPERT_MATRICES[matrix]}", key, slot=int(expert))]
    m = re.match(r"^model\.layers\.(\d+)\.(.+)$", key)
    if m and m.group(2) in _OTHER:
        return [Piece(f"layers.{m.group(1)}.{_OTHER[m.group(2)]}", key)]
    return llama_hf.pieces(key)


def _to_hf_state(tensors: dict[str, torch.Tensor], model_cfg) -> dict[str, torch.Tensor]:
    back = {ours: hf for hf, ours in _OTHER.items()}
    names = {ours: hf for hf, ours in _EXPERT_MATRICES.items()}
    out, dense = {}, {}
    for name, t in tensors.items():
        m = _STACKED.match(name)
        leaf = name.split(".", 2)[-1]
        if m:
            layer, matrix = m.groups()
            out.update(unstack(t, lambda j: f"model.layers.{layer}.mlp.experts.{j}.{names[matrix]}.weight"))
        elif leaf in back:
            out[f"model.layers.{name.split('.')[1]}.{back[leaf]}"] = t
        else:
            dense[name] = t
    return {**llama_hf.to_hf_state(dense, model_cfg), **out}


MOE_ADAPTER = types.SimpleNamespace(
    pieces=_pieces, to_hf_state=_to_hf_state, is_state=llama_hf.is_state, check_exportable=lambda m: None,
    hf_config=lambda m: {"model_type": "llama", "architectures": ["LlamaForCausalLM"]},
    check_hf_config=lambda conf, path, m: None)


@pytest.fixture
def moe_llama(monkeypatch):
    """The llama family, its Hugging Face adapter replaced by the synthetic one that knows expert names."""
    monkeypatch.setattr(family("llama"), "hf_adapter", lambda: MOE_ADAPTER)


@pytest.fixture
def exported(moe_llama, tmp_path):
    """A random MoE checkpoint exported as a Hugging Face folder: (folder, {parameter: tensor}, config)."""
    model, cfg = save_random_checkpoint(tmp_path / "ck", compose_config(TINY_MOE), step=1, matrix_std=0.2)
    summary = export_checkpoint(tmp_path / "ck", "hf", tmp_path / "hf")
    assert summary["kind"] == "Hugging Face Llama folder"
    return tmp_path / "hf", {n: p.detach() for n, p in model.named_parameters()}, cfg


def test_piece_shape_and_take_of_one_row():
    stored = torch.arange(6.0).reshape(2, 3)
    row = Piece("layers.0.mlp.experts.proj", "k", transpose=True, slot=5)
    assert row.stacked and not Piece("a", "k").stacked
    assert row.shape((2, 3)) == (3, 2)
    assert torch.equal(row.take(stored), stored.t())
    assert list(unstack(torch.zeros(3, 2, 2), lambda j: f"e{j}")) == ["e0", "e1", "e2"]


def test_export_unstacks_and_init_from_stacks_back_bit_for_bit(exported):
    folder, params, cfg = exported
    sd = read_safetensors(folder / "model.safetensors")
    stacked = params["layers.1.mlp.experts.proj"]
    assert stacked.shape == (EXPERTS, 32, 8)
    for j in range(EXPERTS):
        assert torch.equal(sd[f"model.layers.1.mlp.experts.{j}.down_proj.weight"], stacked[j])
    assert not any("experts.gate" in k or k.endswith("experts.proj") for k in sd)
    assert len([k for k in sd if ".experts." in k]) == 3 * EXPERTS  # layer 0 is dense

    source = inspect_pretrained(folder, cfg.model)
    assert source.format == "hf-llama" and len(source.pieces["layers.1.mlp.experts.gate"]) == EXPERTS
    assert source.describe().endswith(f"({sum(t.numel() for t in sd.values()):,} parameters) from {folder} "
                                      f"(HF Llama)")
    loaded = source.load()
    assert list(loaded) == list(params)
    for name, want in params.items():
        got = loaded[name][:250] if name == "embed.tok.weight" else loaded[name]
        want = want[:250] if name == "embed.tok.weight" else want
        assert torch.equal(got, want), name
        assert torch.equal(source[name], loaded[name]), name  # what a worker reads, one parameter at a time


def _shard(folder, shards: int) -> None:
    """Rewrite the folder's model.safetensors as `shards` files with model.safetensors.index.json, the experts of
    one layer spread over several files."""
    sd = read_safetensors(folder / "model.safetensors")
    (folder / "model.safetensors").unlink()
    names = sorted(sd)
    weight_map = {}
    for i in range(shards):
        file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: sd[n] for n in names[i::shards]}
        write_safetensors(part, folder / file)
        weight_map.update(dict.fromkeys(part, file))
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def test_experts_spread_over_shards_load_the_same(exported):
    folder, params, cfg = exported
    _shard(folder, 2)
    source = inspect_pretrained(folder, cfg.model)
    files = {source.stored[p.key].file.name for p in source.pieces["layers.1.mlp.experts.fc"]}
    assert len(source.files) == 2 and len(files) == 2
    loaded = source.load()
    assert all(torch.equal(loaded[n], params[n]) for n in params if n != "embed.tok.weight")


def _refusal(folder, *overrides: str) -> str:
    with pytest.raises(ConfigError) as e:
        inspect_pretrained(folder, compose_config([*TINY_MOE, *overrides]).model)
    assert e.value.key == "model.init_from"
    return e.value.message


def test_a_missing_expert_is_named(exported):
    folder, _, _ = exported
    path = folder / "model.safetensors"
    sd = read_safetensors(path)
    del sd["model.layers.1.mlp.experts.2.gate_proj.weight"]
    write_safetensors(sd, path)
    assert _refusal(folder) == (f"missing expert 2 of layers.1.mlp.experts.gate in {folder} (found the tensors of "
                                f"3 of its 4 experts)")


def test_a_wrong_per_expert_shape_names_the_config_key(exported):
    folder, _, _ = exported
    path = folder / "model.safetensors"
    assert _refusal(folder, "model.moe.expert_ffn_dim=12") == (
        f"model.layers.1.mlp.experts.0.gate_proj.weight (expert 0 of layers.1.mlp.experts.gate) is [8, 32] in {path} "
        f"but the config builds [12, 32] per expert (model.moe.expert_ffn_dim)")
    # d_model, the second dimension of an expert's down_proj: the row check reports the first differing one.
    sd = read_safetensors(path)
    sd["model.layers.1.mlp.experts.3.down_proj.weight"] = torch.zeros(32, 9)
    write_safetensors(sd, path)
    assert _refusal(folder) == (
        f"model.layers.1.mlp.experts.3.down_proj.weight (expert 3 of layers.1.mlp.experts.proj) is [32, 9] in "
        f"{path} but the config builds [32, 8] per expert (model.moe.expert_ffn_dim)")


def test_more_stored_experts_than_the_model_has_names_n_experts(exported):
    folder, _, _ = exported
    path = folder / "model.safetensors"
    sd = read_safetensors(path)
    sd["model.layers.1.mlp.experts.4.up_proj.weight"] = torch.zeros(8, 32)
    write_safetensors(sd, path)
    assert _refusal(folder) == (f"layers.1.mlp.experts.fc is [5, 8, 32] (stacked from 5 tensors) in {path} but "
                                f"the config builds [4, 8, 32] (model.moe.n_experts)")


def test_a_dense_llama_adapter_refuses_to_export_experts(tmp_path):
    save_random_checkpoint(tmp_path / "ck", compose_config(TINY_MOE), step=1, matrix_std=0.2)
    with pytest.raises(ConfigError) as e:
        export_checkpoint(tmp_path / "ck", "hf", tmp_path / "hf")
    assert str(e.value) == ("--format: Hugging Face Llama has no mixture-of-experts layers (model.moe is set); use "
                            "--format safetensors")
    assert not (tmp_path / "hf").exists()


def _moved_bias(model) -> None:
    model.layers["1"].mlp.router_bias.copy_(torch.tensor([0.5, -0.25, 0.0, 1.0]))


def test_a_routing_bias_is_kept_by_the_checkpoint_readers_and_refused_by_a_hugging_face_export(moe_llama, tmp_path):
    """The routing bias is a persistent buffer, no parameter: `generate`/`eval` and the llmtrain export keep it, a
    Hugging Face export (no place for it) refuses it unless it is zero, init_from of an llmtrain export passes it
    over (a new run's bias starts at zero)."""
    from llmtrain.checkpoint.export import load_model_state
    from llmtrain.inference.checkpoint_model import load_checkpoint_model

    name = "layers.1.mlp.router_bias"
    model, cfg = save_random_checkpoint(tmp_path / "ck", compose_config(TINY_MOE), step=1, matrix_std=0.2,
                                        before_save=_moved_bias)
    state, _ = load_model_state(tmp_path / "ck")
    assert torch.equal(state[name], torch.tensor([0.5, -0.25, 0.0, 1.0]))
    loaded = load_checkpoint_model(str(tmp_path / "ck"), torch.device("cpu"))
    assert torch.equal(loaded.model.layers["1"].mlp.router_bias, state[name])

    summary = export_checkpoint(tmp_path / "ck", "safetensors", tmp_path / "st")
    assert torch.equal(read_safetensors(tmp_path / "st" / "model.safetensors")[name], state[name])
    assert summary["num_params"] == sum(p[:250].numel() if n == "embed.tok.weight" else p.numel()
                                        for n, p in model.named_parameters())
    source = inspect_pretrained(tmp_path / "st", cfg.model)
    assert name not in source and len(source) == len(dict(model.named_parameters()))

    with pytest.raises(ConfigError) as e:
        export_checkpoint(tmp_path / "ck", "hf", tmp_path / "hf")
    assert str(e.value) == (f"--format: {name} is not zero and Hugging Face Llama has no place for it; use --format "
                            f"safetensors")
    assert not (tmp_path / "hf").exists()
