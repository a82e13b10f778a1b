"""Tensor parallel from a family's plan (model/family.py -> parallel/tensor_parallel.py): which style each block
submodule gets, and that a tp=2 toy model (per-head q/k norms, a dense block and a mixture-of-experts block)
computes the same logits and gradients as the whole model, with and without sequence parallel."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from helpers.ranks import run_ranks
from torch import nn

from llmtrain.model.decoder import Decoder
from llmtrain.model.family import FamilySpec
from llmtrain.model.registry import family

D, HEAD, VOCAB, SEQ = 16, 4, 32, 8
LLAMA_BLOCK = {"ln_1", "attn", "attn.q", "attn.k", "attn.v", "attn.proj", "attn.rope", "ln_2", "mlp", "mlp.gate",
               "mlp.fc", "mlp.proj"}
SPARSE_BLOCK = (LLAMA_BLOCK - {"mlp.gate", "mlp.fc", "mlp.proj"}) | {"mlp.router", "mlp.experts", "mlp.shared",
                                                                     "mlp.shared.gate", "mlp.shared.fc",
                                                                     "mlp.shared.proj"}


class HeadNormSpec(FamilySpec):
    qk_norm = "head"


def test_llama_and_gpt2_plans_are_megatron_column_then_row():
    plan = family("llama").tensor_parallel_plan(LLAMA_BLOCK)
    assert plan == {"ln_1": "sequence", "ln_2": "sequence", "attn": "gather", "attn.q": "colwise",
                    "attn.k": "colwise", "attn.v": "colwise", "attn.proj": "rowwise", "mlp": "gather",
                    "mlp.gate": "colwise", "mlp.fc": "colwise", "mlp.proj": "rowwise"}
    gpt2 = family("gpt2").tensor_parallel_plan(LLAMA_BLOCK - {"mlp.gate", "attn.rope"})
    assert "mlp.gate" not in gpt2 and gpt2["mlp.fc"] == "colwise" and gpt2["mlp.proj"] == "rowwise"


def test_a_sparse_block_is_replicated_whole_and_per_head_norms_stay_on_local_heads():
    plan = HeadNormSpec().tensor_parallel_plan(SPARSE_BLOCK | {"attn.q_norm", "attn.k_norm"})
    assert plan["mlp"] == "replicated"
    assert not [name for name in plan if name.startswith("mlp.")]  # nothing inside the experts is split
    assert plan["attn.q_norm"] == plan["attn.k_norm"] == "head_norm"
    assert "attn.q_norm" not in family("llama").tensor_parallel_plan(SPARSE_BLOCK | {"attn.q_norm"})


class Attention(nn.Module):
    """Per-head work only (as attention is, over heads), with Qwen3-style q and k norms over each head."""

    def __init__(self):
        super().__init__()
        self.q, self.k, self.v, self.proj = (nn.Linear(D, D, bias=False) for _ in range(4))
        self.q_norm, self.k_norm = nn.RMSNorm(HEAD), nn.RMSNorm(HEAD)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = (m(x).view(b, t, -1, HEAD) for m in (self.q, self.k, self.v))
        q, k = self.q_norm(q), self.k_norm(k)
        return self.proj(((q * k).sum(-1, keepdim=True).tanh() * v).reshape(b, t, -1))


class Experts(nn.Module):
    """Stands in for a mixture of experts: plain weights, a router, and a mean over the whole sequence, so it is
    right only when it sees every token."""

    def __init__(self):
        super().__init__()
        self.router = nn.Linear(D, 3, bias=False)
        self.experts = nn.Module()
        self.experts.proj = nn.Parameter(torch.randn(3, D, D) * 0.2)

    def forward(self, x):
        weights = F.softmax(self.router(x), dim=-1)
        mixed = torch.einsum("bte,edf,btf->btd", weights, self.experts.proj, x)
        return mixed + x.mean(dim=1, keepdim=True)


class SwiGLU(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate, self.fc = nn.Linear(D, 2 * D, bias=False), nn.Linear(D, 2 * D, bias=False)
        self.proj = nn.Linear(2 * D, D, bias=False)

    def forward(self, x):
        return self.proj(F.silu(self.gate(x)) * self.fc(x))


class Block(nn.Module):
    def __init__(self, args, layer: int):
        super().__init__()
        self.ln_1, self.attn, self.ln_2 = nn.RMSNorm(D), Attention(), nn.RMSNorm(D)
        self.mlp = SwiGLU() if layer == 0 else Experts()

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Embedding(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, D)

    def forward(self, idx):
        return self.tok(idx)


def _toy() -> Decoder:
    torch.manual_seed(0)
    model = Decoder(SimpleNamespace(n_layers=2, d_model=D, vocab_size=VOCAB, tie_embeddings=True), Embedding(),
                    Block, nn.RMSNorm(D))
    with torch.no_grad():  # norms away from 1, so their gradients matter
        for name, p in model.named_parameters():
            if "norm" in name or "ln_" in name:
                p.add_(torch.rand(p.shape))
    return model


def _grads(model) -> dict[str, torch.Tensor]:
    from torch.distributed.tensor import DTensor

    return {name: p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
            for name, p in model.named_parameters()}


def _relative(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got - want).abs().max() / want.abs().max()).item()


def _tp_against_whole(rank: int, world: int, sequence_parallel: bool) -> dict[str, float]:
    from torch.distributed.device_mesh import init_device_mesh

    from llmtrain.parallel.tensor_parallel import apply_tensor_parallel

    whole = _toy()
    split = copy.deepcopy(whole)
    apply_tensor_parallel(split, HeadNormSpec(), init_device_mesh("cpu", (world,)), sequence_parallel)
    gen = torch.Generator().manual_seed(1)
    ids, weights = torch.randint(0, VOCAB, (2, SEQ), generator=gen), torch.randn(2, SEQ, VOCAB, generator=gen)
    reference = whole(ids)
    (reference * weights).sum().backward()
    logits = split(ids).full_tensor()
    (logits * weights).sum().backward()
    diffs = {"logits": _relative(logits, reference)}
    mine, theirs = _grads(split), _grads(whole)
    diffs.update({name: _relative(mine[name], theirs[name]) for name in theirs})
    diffs["replicated params"] = float(sum(not hasattr(p, "placements") for p in split.layers["1"].mlp.parameters()))
    return diffs


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_tp2_matches_the_whole_model_with_a_replicated_mixture_of_experts(sequence_parallel):
    first, second = run_ranks(2, _tp_against_whole, sequence_parallel)
    assert first == second
    assert first.pop("replicated params") == 2.0  # the router and the experts stay plain tensors on every rank
    assert set(first) >= {"logits", "layers.0.attn.q_norm.weight", "layers.1.mlp.router.weight",
                          "layers.1.mlp.experts.proj", "layers.0.mlp.gate.weight"}
    assert max(first.values()) < 1e-5, {k: v for k, v in first.items() if v >= 1e-5}
