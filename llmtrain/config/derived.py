"""Numbers that follow from the config, worked out in one place: validation, the launcher, the worker and
`llmtrain plan` read them here rather than each computing them again. No torch at import (the launcher and plan
start fast)."""

from __future__ import annotations

from dataclasses import dataclass

from llmtrain.model.registry import family_of

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def padded_vocab_size(model_cfg) -> int:
    """Embedding rows: model.vocab_size rounded up to model.vocab_pad_multiple."""
    m = model_cfg.vocab_pad_multiple
    return -(-model_cfg.vocab_size // m) * m


def head_dim(model_cfg) -> int:
    """Width of one attention head: model.head_dim, else d_model / n_heads."""
    return model_cfg.head_dim or model_cfg.d_model // model_cfg.n_heads


def kv_heads(model_cfg) -> int:
    """Key/value heads: the family's (model.n_kv_heads, null = n_heads, where the family reads it)."""
    return family_of(model_cfg).kv_heads(model_cfg)


def ffn_dim(model_cfg) -> int:
    """Hidden width of the dense MLP: model.ffn_dim, else the family's sizing (GPT-2: 4 x d_model; Llama's SwiGLU:
    2/3 of that, times ffn_dim_multiplier, rounded up to multiple_of)."""
    if model_cfg.ffn_dim is not None:
        return model_cfg.ffn_dim
    return family_of(model_cfg).ffn_dim(model_cfg)


def world_size(cfg) -> int:
    return cfg.cluster.nnodes * cfg.cluster.nproc_per_node


def torch_dtype(name: str):
    """The torch dtype of a config dtype name (precision.compute_dtype, reduce_dtype): they are torch's names."""
    import torch

    return getattr(torch, name)


@dataclass(frozen=True)
class Derived:
    world_size: int  # cluster.nnodes x cluster.nproc_per_node
    micro_batches: int  # per optimizer step and dp rank (gradient accumulation, or the pipeline's micro-batches)
    padded_vocab: int
    tokens_per_step: int  # train.global_batch_size x model.seq_len
    compute_bytes: int  # bytes per element of precision.compute_dtype

    @classmethod
    def of(cls, cfg) -> Derived:
        """From a composed config (dp and global_batch_size already filled in, see compose.py)."""
        t = cfg.train
        return cls(world_size=world_size(cfg),
                   micro_batches=t.global_batch_size // (t.micro_batch_size * cfg.parallel.dp),
                   padded_vocab=padded_vocab_size(cfg.model), tokens_per_step=t.global_batch_size * cfg.model.seq_len,
                   compute_bytes=DTYPE_BYTES[cfg.precision.compute_dtype])
