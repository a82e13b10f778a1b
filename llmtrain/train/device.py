"""The device a worker trains on."""

from __future__ import annotations

import torch


def resolve_device(name: str, local_rank: int) -> torch.device:
    if name == "cuda" or (name == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise RuntimeError("device=cuda but torch.cuda.is_available() is False on this node")
        torch.cuda.set_device(local_rank)
        # fp32 matmuls and convolutions on TF32 tensor cores (precision=fp32). These flags touch CUDA only, while
        # torch.set_float32_matmul_precision would also change CPU (oneDNN) matmuls.
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        return torch.device("cuda", local_rank)
    return torch.device("cpu")
