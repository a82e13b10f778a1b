"""The model and measured points of the CUDA planning tests, and the plan they predict."""

from __future__ import annotations

from llmtrain.config import compose_config
from llmtrain.launch.config_probes import validate_here
from llmtrain.plan.cli import plan_for


# gpt-1.3b in the GPT-3 paper's shape (24 layers, d_model 2048, 24 heads x 128, vocab 50304: 1.517e9 parameters),
# bf16, seq 2048, one GPU, synthetic data; measured with the full logits' loss (train.loss=full), before the model
# returned its loss (the plan's peak is at another moment than the loss at these points, so it is the same).
MODEL = ["model=gpt-1.3b", "model.n_heads=24", "model.head_dim=128", "precision=bf16", "device=cuda",
         "hardware=h200", "cluster.nproc_per_node=1", "data=synthetic", "train.loss=full"]


# (overrides, measured peak GiB, measured saved-activation bytes or None)
POINTS = {
    "micro 4": (["train.micro_batch_size=4", "train.global_batch_size=8", "optim.fused=none"], 47.48, 22.51e9),
    "micro 4, recompute=full": (["train.micro_batch_size=4", "train.global_batch_size=8", "optim.fused=none",
                                 "recompute=full"], 29.83, 3.57e9),
    "micro 8, fused AdamW + compile": (["train.micro_batch_size=8", "train.global_batch_size=16",
                                        "optim.fused=torch", "train.compile=true"], 64.97, None),
}


def planned(overrides: list[str]):
    """What `llmtrain plan` computes: compose, validate, plan_for."""
    cfg = compose_config(overrides)
    validate_here(cfg)
    return plan_for(cfg)
