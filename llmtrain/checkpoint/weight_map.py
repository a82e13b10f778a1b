"""How a parameter of llmtrain's model is found in a weights file of another naming (Hugging Face GPT-2 or
Llama), and which config key sets each dimension of it.

A `Piece` says where one llmtrain parameter comes from: a stored tensor, maybe transposed (GPT-2's Conv1D), maybe
one of several equal row blocks of it (GPT-2's fused q/k/v). The same Piece gives the shape from a file header
(the pre-launch check, no tensor data read) and the tensor itself (the load), so both agree by construction.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

EMBED = "embed.tok.weight"
POS = "embed.pos.weight"
HEAD = "head.weight"
# Wrapper prefixes that may appear inside a parameter name (activation checkpointing, torch.compile).
_WRAPPER_PREFIXES = ("_checkpoint_wrapped_module.", "_orig_mod.")


def clean_name(name: str) -> str:
    for prefix in _WRAPPER_PREFIXES:
        name = name.replace(prefix, "")
    return name


@dataclass(frozen=True)
class Piece:
    name: str  # llmtrain parameter name
    key: str  # name of the stored tensor
    transpose: bool = False
    part: int = 0  # which of `parts` equal blocks along dim 0 (after transposing)
    parts: int = 1

    def shape(self, stored: tuple[int, ...]) -> tuple[int, ...]:
        shape = tuple(reversed(stored)) if self.transpose and len(stored) == 2 else tuple(stored)
        if self.parts > 1 and shape and shape[0] % self.parts == 0:
            shape = (shape[0] // self.parts, *shape[1:])
        return shape  # a fused tensor that does not split evenly keeps its shape: the check reports it

    def take(self, stored: torch.Tensor) -> torch.Tensor:
        t = stored.t() if self.transpose and stored.dim() == 2 else stored
        return t.chunk(self.parts, dim=0)[self.part] if self.parts > 1 else t


def model_shapes(model_cfg) -> dict[str, tuple[int, ...]]:
    """{parameter name: shape} of the model `model_cfg` builds (on the meta device: no memory, no init). A tied
    head is not listed: it is embed.tok.weight."""
    from llmtrain.model import build_model

    with torch.device("meta"):
        model = build_model(model_cfg)
    return {name: tuple(p.shape) for name, p in model.named_parameters()}


def shape_key(name: str, dim: int, arch: str = "gpt2") -> str:
    """The config key that sets dimension `dim` of parameter `name` (for a shape-mismatch message)."""
    leaf = name.split(".", 2)[-1] if name.startswith("layers.") else name
    if name in (EMBED, HEAD):
        return "model.vocab_size" if dim == 0 else "model.d_model"
    if name == POS:
        return "model.seq_len" if dim == 0 else "model.d_model"
    if leaf in ("attn.k.weight", "attn.v.weight", "attn.k.bias", "attn.v.bias") and dim == 0:
        return "model.n_kv_heads" if arch == "llama" else "model.n_heads"
    if (leaf in ("attn.q.weight", "attn.q.bias") and dim == 0) or (leaf == "attn.proj.weight" and dim == 1):
        return "model.n_heads"
    if (leaf in ("mlp.fc.weight", "mlp.gate.weight", "mlp.fc.bias") and dim == 0) or \
            (leaf == "mlp.proj.weight" and dim == 1):
        return "model.ffn_dim" if arch == "llama" else "model.d_model"
    return "model.d_model"
