"""What the output head and its cross entropy hold, by the train.loss a run resolves to (llmtrain/loss/).

Bytes of one micro-batch on the last stage, beyond what the head's input terms already count:
- full: log_softmax keeps its fp32 output (tokens x vocab/tp) until backward, and backward starts with two more
  fp32 tensors of that size (nll_loss's gradient and log_softmax's);
- chunked: the gradients forward already made are kept (the head weight's, vocab/tp x d_model, in the compute
  dtype, fp16's in fp32; the hidden states', which replaces the head's input), one chunk's logits exist at a time
  in forward (fp32, and in the compute dtype while cast), and backward starts by scaling the kept gradients into
  new tensors (plus an fp32 copy of the weight's for fp32 master weights under a lower compute dtype). Each
  micro-batch in flight keeps its own (a GPipe schedule runs every forward before any backward);
- liger: as chunked, with Liger-Kernel's chunk (about tokens x d_model logits, in the compute dtype) and its
  in-place scaling.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmtrain.config.derived import DTYPE_BYTES, padded_vocab_size
from llmtrain.loss import CHUNKED, FULL, LIGER, chunk_tokens_for, resolve_loss

FP32 = 4


@dataclass
class LossMemory:
    kind: str  # the resolved train.loss
    saved: float  # held from the loss to the start of backward
    forward: float  # short-lived, during the loss's forward
    backward: float  # short-lived, at the start of backward


def on_gpu(cfg, hw_name: str) -> bool:
    """Whether the plan is for a GPU: device=cuda, or device=auto with a GPU hardware profile."""
    return cfg.device == "cuda" or (cfg.device == "auto" and hw_name != "cpu")


def resolved_loss(cfg, gpu: bool) -> str:
    """The train.loss the workers will run (auto resolved with this machine's Liger-Kernel install)."""
    return resolve_loss(cfg.train.loss, "cuda" if gpu else "cpu", cfg.parallel.tp, cfg.parallel.pp)


def loss_memory(cfg, micro_batch: int, gpu: bool) -> LossMemory:
    m, t = cfg.model, cfg.train
    tokens = micro_batch * m.seq_len
    vocab = padded_vocab_size(m) / cfg.parallel.tp
    c = DTYPE_BYTES[cfg.precision.compute_dtype]
    kind = resolved_loss(cfg, gpu)
    if kind == FULL:
        logits = tokens * vocab * FP32
        cast_back = tokens * vocab * c if c != FP32 else 0.0  # the logits' gradient in the compute dtype
        return LossMemory(kind, logits, 0.0, 2 * logits + cast_back)
    fp16 = cfg.precision.compute_dtype == "float16"
    kept = FP32 if fp16 else c  # the chunked loss keeps fp16's gradients in fp32
    weight_grad = vocab * m.d_model * c
    master_copy = vocab * m.d_model * FP32 if c != FP32 else 0.0
    if kind == LIGER:
        increase = -(-int(vocab) // m.d_model)
        chunk = 1 << max(0, (-(-tokens // increase) - 1).bit_length())  # Liger's power of two
        return LossMemory(kind, weight_grad, min(chunk, tokens) * vocab * c, master_copy)
    assert kind == CHUNKED, kind
    chunk = t.loss_chunk_tokens or chunk_tokens_for(tokens, int(vocab), m.d_model)
    chunk = min(chunk, tokens)
    per_chunk = chunk * vocab * (FP32 + (2 * c if c != FP32 else 0))  # fp32 logits; the cast in and the gradient out
    if fp16:
        per_chunk += vocab * m.d_model * c  # each chunk's weight gradient, before it is added in fp32
    kept_grads = vocab * m.d_model * kept + (tokens * m.d_model * (kept - c))  # beyond the head input's size
    return LossMemory(kind, kept_grads, per_chunk, kept_grads + tokens * m.d_model * c + master_copy)
