"""How a parameter of llmtrain's model is found in a weights file of another naming (a family's Hugging Face
adapter gives its `Piece`s: llmtrain/model/weight_pieces.py), the shapes the config builds, and which config key
sets each dimension of a parameter (for a shape-mismatch message).
"""

from __future__ import annotations

import torch

from llmtrain.model.weight_pieces import EMBED, HEAD, POS, Piece, unstack  # noqa: F401 - re-exported

# Wrapper prefixes that may appear inside a parameter name (activation checkpointing, torch.compile).
_WRAPPER_PREFIXES = ("_checkpoint_wrapped_module.", "_orig_mod.")


def clean_name(name: str) -> str:
    for prefix in _WRAPPER_PREFIXES:
        name = name.replace(prefix, "")
    return name


def state_shapes(model_cfg) -> tuple[dict[str, tuple[int, ...]], dict[str, tuple[int, ...]]]:
    """({parameter name: shape}, {persistent buffer name: shape}) of the model `model_cfg` builds (on the meta
    device: no memory, no init). A tied head is not listed: it is embed.tok.weight. Persistent buffers (a
    mixture-of-experts layer's routing bias) are saved in checkpoints but are no parameters."""
    from llmtrain.model import build_model

    with torch.device("meta"):
        model = build_model(model_cfg)
    saved = model.state_dict(keep_vars=True)
    return ({name: tuple(p.shape) for name, p in model.named_parameters()},
            {name: tuple(b.shape) for name, b in model.named_buffers() if name in saved})


def model_shapes(model_cfg) -> dict[str, tuple[int, ...]]:
    """{parameter name: shape} of the model `model_cfg` builds."""
    return state_shapes(model_cfg)[0]


def shape_key(name: str, dim: int, spec) -> str:
    """The config key that sets dimension `dim` of parameter `name` of a model of family `spec` (a FamilySpec)."""
    if name in (EMBED, HEAD):
        return "model.vocab_size" if dim == 0 else "model.d_model"
    if name == POS:
        return "model.seq_len" if dim == 0 else "model.d_model"
    return spec.shape_key(name.split(".", 2)[-1] if name.startswith("layers.") else name, dim)
