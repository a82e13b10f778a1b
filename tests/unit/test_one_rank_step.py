"""A job of one rank: its training steps run no collective (the flags all-reduce and the straggler watch's gather
have no peer to agree with) and switch the model back to train mode only after an eval."""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist

from llmtrain.config import compose_config
from llmtrain.launch.config_probes import validate_here

TINY = ["data=synthetic", "model.n_layers=2", "model.d_model=32", "model.n_heads=2", "model.seq_len=16",
        "cluster.nproc_per_node=1", "train.micro_batch_size=2", "train.global_batch_size=2", "train.max_steps=3",
        "train.log_interval=1", "train.eval_interval=2", "train.eval_steps=1", "train.warmup_steps=1",
        "checkpoint.at_end=false", "checkpoint.resume=none"]


def test_one_rank_trains_without_collectives_and_in_train_mode_after_an_eval(tmp_path, one_rank, monkeypatch):
    from llmtrain.train.trainer import Trainer

    cfg = compose_config([*TINY, f"run.dir={tmp_path}"])
    validate_here(cfg)
    assert cfg.launch.straggler_factor > 0  # detection is on by default: one rank has nobody to compare with
    trainer = Trainer(cfg, str(tmp_path), torch.device("cpu"))
    assert trainer.stragglers is None and not trainer.compute.enabled

    calls: list[tuple[str, str]] = []

    def recorded(name):
        real = getattr(dist, name)

        def call(*args, **kwargs):
            calls.append((name, sys._getframe(1).f_code.co_name))
            return real(*args, **kwargs)
        return call

    for name in ("all_reduce", "all_gather", "broadcast"):
        monkeypatch.setattr(dist, name, recorded(name))
    modes: list[bool] = []
    trainer.model.parts[0].register_forward_pre_hook(lambda module, args: modes.append(module.training))
    trainer.train()

    assert [c for c in calls if c[1] in ("train_step", "interval_done", "global_mean_loss")] == []
    # Steps 1 and 2 in train mode, the eval after step 2 (eval_steps=1) in eval mode, step 3 in train mode again,
    # then the eval of the last step.
    assert modes == [True, True, False, True, False]
