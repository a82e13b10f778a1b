"""train.attention: the kernel every attention call of a step (forward, backward, evaluation) is restricted to."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers.refusals import validate_refusal

from llmtrain.config import compose_config
from llmtrain.launch.config_probes import validate_here
from llmtrain.model import build_model, init_parameters
from llmtrain.train.attention import attention_context

TINY = ["data=synthetic", "model.n_layers=2", "model.d_model=32", "model.n_heads=2", "model.seq_len=16",
        "cluster.nproc_per_node=1", "train.micro_batch_size=2", "train.global_batch_size=2", "train.max_steps=2",
        "train.log_interval=1", "train.eval_interval=2", "train.eval_steps=1", "train.warmup_steps=1",
        "checkpoint.at_end=false", "checkpoint.resume=none"]


def _enabled() -> tuple[bool, bool]:
    return torch.backends.cuda.flash_sdp_enabled(), torch.backends.cuda.math_sdp_enabled()


def test_a_choice_restricts_attention_to_its_kernel_and_auto_to_none():
    assert _enabled() == (True, True)
    with attention_context("math"):
        assert _enabled() == (False, True)
    with attention_context("flash"):
        assert _enabled() == (True, False)
    with attention_context("auto"):
        assert _enabled() == (True, True)


@pytest.mark.parametrize("model", ["gpt-tiny", "llama-tiny"])
def test_flash_and_math_give_the_same_loss_and_gradients_on_cpu(model):
    cfg = compose_config([f"model={model}", "model.n_layers=2", "model.d_model=64", "model.seq_len=32"])
    net = build_model(cfg.model)
    init_parameters(net, 0, 0.02, cfg.model.n_layers)
    x = torch.randint(0, cfg.model.vocab_size, (2, 32))
    results = {}
    for name in ("math", "flash"):
        net.zero_grad()
        with attention_context(name):
            loss = net(x, targets=x)
            loss.backward()
        results[name] = (loss.item(), [p.grad.clone() for p in net.parameters()])
    assert abs(results["math"][0] - results["flash"][0]) <= 1e-5
    for a, b in zip(results["math"][1], results["flash"][1]):
        assert (a - b).abs().max().item() <= 1e-4 * max(1.0, b.abs().max().item())


def test_the_trainer_runs_every_attention_call_under_the_choice(tmp_path, one_rank, monkeypatch):
    """Training steps (forward and backward) and the evaluation both see only the math kernel allowed."""
    from llmtrain.train.trainer import Trainer

    seen = []
    real = F.scaled_dot_product_attention

    def recorded(*args, **kwargs):
        seen.append(_enabled())
        return real(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", recorded)
    cfg = compose_config([*TINY, f"run.dir={tmp_path}", "train.attention=math"])
    validate_here(cfg)
    Trainer(cfg, str(tmp_path), torch.device("cpu")).train()
    assert len(seen) == 2 * 2 + 2  # two layers: two training steps and one evaluation
    assert set(seen) == {(False, True)}


def test_a_cuda_only_kernel_on_a_cpu_is_refused_naming_the_key():
    key, message = validate_refusal("train.attention=cudnn", "device=cpu")
    assert key == "train.attention" and "CUDA only" in message
