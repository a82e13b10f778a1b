"""How the output head and its cross entropy run (train.loss): which implementation a run uses, and the model's
head_loss for it. Imports no torch itself, so the launcher and the planner can resolve the choice cheaply."""

from __future__ import annotations

from importlib.util import find_spec

FULL, CHUNKED, LIGER = "full", "chunked", "liger"

# A chunk's fp32 logits may take this many bytes (or the hidden states' size in fp32, if larger): small next to a
# large vocabulary's full logits, big enough that each chunk's matmul stays efficient.
CHUNK_BYTES = 64 * 2**20


def chunk_tokens_for(tokens: int, vocab_local: int, d_model: int) -> int:
    """Tokens per chunk by default: a chunk's fp32 logits about max(CHUNK_BYTES, the hidden states in fp32)."""
    budget = max(CHUNK_BYTES, tokens * d_model * 4)
    return max(1, min(tokens, budget // (vocab_local * 4)))


LIGER_PACKAGE = "liger_kernel"


def liger_installed() -> bool:
    return find_spec(LIGER_PACKAGE) is not None


def resolve_loss(choice: str, device_type: str, tp: int, pp: int = 1, liger: bool | None = None) -> str:
    """train.loss=auto: Liger-Kernel's fused kernel on a CUDA device without tensor parallel (its kernel takes the
    whole vocabulary) or a pipeline (a zero-bubble schedule may run a loss's backward twice, and Liger scales its
    kept gradients in place) when the liger extra is installed, our chunked loss everywhere else."""
    if choice != "auto":
        return choice
    liger = liger_installed() if liger is None else liger
    return LIGER if device_type == "cuda" and tp == 1 and pp == 1 and liger else CHUNKED


def check_loss_device(name: str, device_type: str) -> None:
    """A worker's refusal of train.loss=liger on a device other than CUDA (device=auto on a node without one)."""
    if name == LIGER and device_type != "cuda":
        from llmtrain.config.errors import ConfigError

        raise ConfigError("train.loss", f"liger runs on CUDA only (this worker's device is {device_type}); use "
                                        "train.loss=chunked")


def head_loss_for(name: str, chunk_tokens: int | None = None):
    """The model's head_loss(hidden, head, targets) for a resolved train.loss."""
    if name == FULL:
        from llmtrain.model.head_loss import logits_loss

        return logits_loss
    if name == LIGER:
        from llmtrain.loss.liger import liger_loss

        return liger_loss
    from llmtrain.loss.head import ChunkedHeadLoss  # torch: imported only by a worker

    return ChunkedHeadLoss(chunk_tokens)
