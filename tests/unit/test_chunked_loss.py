"""train.loss=chunked against the full logits' loss: in fp32 the same loss (to 1e-6) and gradients (to 1e-5 of their
largest element: fp32 sums in another order), under autocast, in eval, and vocabulary-parallel over two ranks (with
and without sequence parallel)."""

from __future__ import annotations

from importlib.util import find_spec as _real_find_spec

import pytest
import torch
from helpers.ranks import run_ranks
from helpers.refusals import validate_refusal
from torch import nn

from llmtrain.config import compose_config
from llmtrain.config.errors import ConfigError
from llmtrain.loss import CHUNKED, LIGER, check_loss_device, chunk_tokens_for, head_loss_for, resolve_loss
from llmtrain.model.head_loss import IGNORE_INDEX, logits_loss


def _case(vocab: int, d: int, b: int, t: int, seed: int = 0):
    torch.manual_seed(seed)
    head = nn.Linear(d, vocab, bias=False)
    hidden = torch.randn(b, t, d, requires_grad=True)
    targets = torch.randint(0, vocab, (b, t))
    return head, hidden, targets


def _loss_and_grads(loss_fn, head, hidden, targets, scale: float = 1.0):
    hidden.grad, head.weight.grad = None, None
    loss = loss_fn(hidden, head, targets)
    (loss * scale).backward()
    return loss.detach(), hidden.grad.clone(), head.weight.grad.clone()


@pytest.mark.parametrize("vocab,d,b,t,chunk", [(2048, 64, 2, 64, None), (1000, 32, 3, 17, 7), (50, 16, 2, 5, 1),
                                               (50, 16, 2, 5, 1000)])
def test_fp32_loss_and_gradients_equal_the_full_logits(vocab, d, b, t, chunk):
    head, hidden, targets = _case(vocab, d, b, t)
    targets[0, :3] = IGNORE_INDEX  # ignored tokens count in neither the loss nor the mean
    want = _loss_and_grads(logits_loss, head, hidden, targets, scale=0.37)
    got = _loss_and_grads(head_loss_for(CHUNKED, chunk), head, hidden, targets, scale=0.37)
    assert got[0].dtype == torch.float32
    assert abs(got[0].item() - want[0].item()) <= 1e-6
    _close(got[1:], want[1:])


def _close(got, want, rel: float = 1e-5):
    for g, w in zip(got, want):
        assert (g - w).abs().max().item() <= rel * w.abs().max().item()


def test_twice_through_backward_gives_the_same_gradients():
    """A zero-bubble schedule may run the loss's backward twice on one graph (input, then weight gradients)."""
    head, hidden, targets = _case(300, 16, 2, 8)
    loss = head_loss_for(CHUNKED, 5)(hidden, head, targets)
    first = torch.autograd.grad(loss, [hidden, head.weight], retain_graph=True)
    second = torch.autograd.grad(loss, [hidden, head.weight])
    assert all(torch.equal(a, b) for a, b in zip(first, second))


@pytest.mark.parametrize("dtype,scale", [(torch.bfloat16, 1.0), (torch.float16, 65536.0)], ids=["bf16", "fp16"])
def test_autocast_matches_the_full_logits_within_its_rounding(dtype, scale):
    """fp16 under its loss scaler's starting scale, 2^16: more than fp16 holds, so it must not be cast to fp16."""
    head, hidden, targets = _case(4096, 64, 2, 32)
    with torch.autocast("cpu", dtype=dtype):
        want = _loss_and_grads(logits_loss, head, hidden, targets, scale)
        got = _loss_and_grads(head_loss_for(CHUNKED, 16), head, hidden, targets, scale)
    assert got[0].dtype == torch.float32 and got[2].dtype == torch.float32  # the fp32 master weight's gradient
    assert abs(got[0].item() - want[0].item()) <= 1e-3 * want[0].item()
    _close(got[1:], want[1:], rel=2e-2)


def test_without_gradients_only_the_loss_is_computed(monkeypatch):
    """In evaluation the head's weight still has requires_grad: no_grad alone must skip the gradients."""
    from llmtrain.loss import chunked

    asked = []
    real = chunked._chunks
    monkeypatch.setattr(chunked, "_chunks", lambda *a: asked.append(a[-1]) or real(*a))
    head, hidden, targets = _case(500, 16, 2, 9)
    with torch.no_grad():
        got = head_loss_for(CHUNKED, 4)(hidden, head, targets)
        want = logits_loss(hidden, head, targets)
    assert asked == [False]
    assert not got.requires_grad and abs(got.item() - want.item()) <= 1e-6


def test_fp16_gradients_of_many_tokens_do_not_underflow():
    """Each token's share of the mean is below fp16's smallest normal number at this count: the chunked loss must
    be as close to the fp32 gradients as the full logits' loss (which scales before it casts)."""
    head, hidden, targets = _case(4096, 64, 4, 1024)
    truth = _loss_and_grads(logits_loss, head, hidden, targets)
    errors = {}
    for name, fn in (("full", logits_loss), ("chunked", head_loss_for(CHUNKED, 512))):
        with torch.autocast("cpu", dtype=torch.float16):
            got = _loss_and_grads(fn, head, hidden, targets, 65536.0)
        errors[name] = max(((g / 65536.0 - w).norm() / w.norm()).item() for g, w in zip(got[1:], truth[1:]))
    assert errors["chunked"] <= 2 * errors["full"] + 1e-3, errors


def test_the_default_chunk_bounds_the_logits_and_keeps_small_vocabularies_whole():
    assert chunk_tokens_for(8192, 128256, 2048) == 130  # llama3-1b: a chunk's fp32 logits ~ the hidden states
    assert chunk_tokens_for(1024, 2048, 256) == 1024  # one chunk: no overhead where the logits are small
    assert chunk_tokens_for(1024, 128256, 128) == 130  # 64 MiB of fp32 logits per chunk


def test_auto_picks_liger_only_on_cuda_without_tensor_or_pipeline_parallel_and_liger_refuses_a_cpu():
    assert resolve_loss("auto", "cuda", 1, liger=True) == LIGER
    assert resolve_loss("auto", "cuda", 2, liger=True) == CHUNKED
    assert resolve_loss("auto", "cuda", 1, pp=2, liger=True) == CHUNKED
    assert resolve_loss("auto", "cuda", 1, liger=False) == CHUNKED
    assert resolve_loss("auto", "cpu", 1, liger=True) == CHUNKED
    with pytest.raises(ConfigError) as e:
        check_loss_device(resolve_loss("liger", "cpu", 1), "cpu")
    assert e.value.key == "train.loss"


def _vocab_parallel(rank: int, world: int, sequence_parallel: bool):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, loss_parallel, parallelize_module

    mesh = init_device_mesh("cpu", (world,))
    head, hidden, targets = _case(1001, 16, 2, 12)  # the same on every rank; 1001 rows shard unevenly
    full = _loss_and_grads(logits_loss, head, hidden, targets)
    layout = Shard(1) if sequence_parallel else Replicate()
    parallelize_module(head, mesh, ColwiseParallel(input_layouts=layout, output_layouts=Shard(-1),
                                                   use_local_output=False))
    # What the blocks hand the head: the sequence shard under sequence parallel, else the whole (replicated).
    local = hidden.detach().chunk(world, dim=1)[rank] if sequence_parallel else hidden.detach()
    out = {}
    for name, fn in (("chunked", head_loss_for(CHUNKED, 5)), ("loss_parallel", logits_loss)):
        mine = local.clone().requires_grad_(True)
        given = DTensor.from_local(mine, mesh, [layout], run_check=False) if sequence_parallel else mine
        head.weight.grad = None
        with loss_parallel():
            loss = fn(given, head, targets)
            loss.backward()
        loss = loss.full_tensor() if isinstance(loss, DTensor) else loss
        out[name] = (loss.item(), mine.grad.clone(), head.weight.grad.full_tensor())
    want_h = full[1].chunk(world, dim=1)[rank] if sequence_parallel else full[1]
    return full[0].item(), want_h, full[2], out


@pytest.mark.parametrize("sequence_parallel", [False, True], ids=["tp2", "tp2+sp"])
def test_vocabulary_parallel_over_two_ranks_equals_one_rank(sequence_parallel):
    for loss, want_h, want_w, out in run_ranks(2, _vocab_parallel, sequence_parallel):
        for name, (got, got_h, got_w) in out.items():
            assert abs(got - loss) <= 1e-6, name
            _close([got_h, got_w], [want_h, want_w])


@pytest.mark.parametrize("overrides,says", [
    (["train.loss=liger", "device=cpu"], "CUDA only"),
    (["train.loss=liger", "device=cuda", "cluster.nproc_per_node=2", "parallel.tp=2"], "parallel.tp=2 shards it"),
    (["train.loss=liger", "device=cuda", "cluster.nproc_per_node=2", "parallel.pp=2", "train.global_batch_size=8"],
     "parallel.pp=2"),
    (["train.loss_chunk_tokens=0"], "must be > 0 or null"),
])
def test_a_loss_that_cannot_run_is_refused_naming_its_key(overrides, says):
    key, message = validate_refusal(*overrides)
    assert key.startswith("train.loss") and says in message, (key, message)


def test_liger_not_installed_is_refused_before_anything_starts(monkeypatch):
    import llmtrain.loss as loss_lib
    from llmtrain.launch import config_probes

    monkeypatch.setattr(loss_lib, "find_spec", lambda name, *a: None if name == "liger_kernel" else _real_find_spec(name, *a))
    with pytest.raises(ConfigError) as e:
        config_probes._train(compose_config(["train.loss=liger", "device=cuda"]))
    assert e.value.key == "train.loss" and "pip install 'llmtrain[liger]'" in e.value.message


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_plan_of_a_gpu_resolves_liger_as_its_workers_will(precision, monkeypatch):
    """Planned on a head node for CUDA workers (fp32 there is planned with the CPU model): no refusal, and the loss
    the plan counts is the one the workers run."""
    import llmtrain.loss as loss_lib
    from llmtrain.plan.cli import plan_for
    from llmtrain.plan.loss_memory import resolved_loss

    monkeypatch.setattr(loss_lib, "liger_installed", lambda: True)
    cfg = compose_config(["device=cuda", "hardware=h100", f"precision={precision}", "cluster.nproc_per_node=1",
                          "model=llama-tiny", "model.vocab_size=128256"])
    assert resolved_loss(cfg, gpu=True) == LIGER
    plan = plan_for(cfg)
    assert plan.peak_bytes_per_rank > 0
    assert precision == "fp32" or any("the liger loss's tensors" in n for n in plan.notes)
