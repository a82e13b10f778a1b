"""The mixture-of-experts block (llmtrain/model/moe/): grouped and looped experts agree, the routing, the auxiliary
losses' values and gradients, the statistics (not counted twice under activation recompute), bias balancing and
bit-for-bit determinism. All in-process on CPU, fp32."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.utils.checkpoint import checkpoint

from llmtrain.errors import ConfigError
from llmtrain.model.moe import MoE, MoEArgs, moe_modules
from llmtrain.model.moe.aux_loss import load_balancing_loss, z_loss
from llmtrain.model.moe.experts import grouped_swiglu, looped_swiglu
from llmtrain.model.moe.router import route

D, F_WIDTH, E = 16, 24, 4  # widths multiples of 8: torch._grouped_mm's 16-byte rows


def moe(seed: int = 0, **overrides) -> MoE:
    fields = dict(n_experts=E, top_k=2, ffn=F_WIDTH, router_aux_loss_coef=0.0, router_z_loss_coef=0.0)
    fields.update(overrides)
    block = MoE(D, MoEArgs(**fields), layer=0)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in block.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    return block


def tokens(seed: int = 1, b: int = 2, t: int = 9) -> torch.Tensor:
    return torch.randn(b, t, D, generator=torch.Generator().manual_seed(seed)).requires_grad_()


def grads(block: MoE, x: torch.Tensor) -> dict[str, torch.Tensor]:
    return {"x": x.grad, **{name: p.grad for name, p in block.named_parameters()}}


def run(block: MoE, x: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Forward, then backward of a loss whose gradient differs per token and feature."""
    out = block(x)
    weight = torch.linspace(-1.0, 1.0, out.numel()).view_as(out)
    (out * weight).sum().backward()
    return out.detach(), grads(block, x)


def assert_close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], tol: float) -> None:
    """Within `tol`, relative to the largest magnitude where that exceeds 1 (fp32 rounding scales with it)."""
    assert a.keys() == b.keys()
    for name in a:
        scale = max(1.0, b[name].abs().max().item())
        assert (a[name] - b[name]).abs().max().item() <= tol * scale, name


@pytest.mark.parametrize("shared", [0, 2])
def test_grouped_mm_matches_the_loop_forward_and_backward(shared):
    # torch 2.13 runs torch._grouped_mm on the CPU (fp32), so the real kernel is compared here.
    looped, grouped = moe(grouped_mm="off", n_shared_experts=shared), moe(grouped_mm="on", n_shared_experts=shared)
    out_loop, g_loop = run(looped, tokens())
    out_grouped, g_grouped = run(grouped, tokens())
    assert (out_loop - out_grouped).abs().max().item() <= 1e-5
    assert_close(g_loop, g_grouped, 1e-5)
    assert g_loop["experts.gate"].abs().sum() > 0


def test_grouped_mm_with_empty_experts_matches_the_loop():
    """Experts 1 and 3 get no token: zero-size groups in the middle and at the end."""
    gen = torch.Generator().manual_seed(3)
    gate, fc = (torch.randn(E, F_WIDTH, D, generator=gen).requires_grad_() for _ in range(2))
    proj = torch.randn(E, D, F_WIDTH, generator=gen).requires_grad_()
    x = torch.randn(7, D, generator=gen).requires_grad_()
    counts = torch.tensor([3, 0, 4, 0])
    upstream = torch.randn(7, D, generator=gen)
    results = []
    for fn in (grouped_swiglu, looped_swiglu):
        out = fn(x, counts, gate, fc, proj)
        (out * upstream).sum().backward()
        results.append({"out": out.detach(), **{n: t.grad.clone() for n, t in
                                                 dict(x=x, gate=gate, fc=fc, proj=proj).items()}})
        for t in (x, gate, fc, proj):
            t.grad = None
    assert_close(results[0], results[1], 1e-5)
    assert results[0]["gate"][1].abs().max() == 0 and results[0]["gate"][3].abs().max() == 0


def test_grouped_index_arithmetic_against_a_reference_grouped_matmul():
    """The group ends handed to the kernel: row r of the sorted tokens belongs to the expert whose range holds r."""
    seen = []

    def reference(a, b, offs):
        seen.append(offs.tolist())
        starts = [0] + offs.tolist()[:-1]
        return torch.cat([a[s:e] @ b[i] for i, (s, e) in enumerate(zip(starts, offs.tolist()))])

    gen = torch.Generator().manual_seed(4)
    gate, fc, proj = (torch.randn(E, *shape, generator=gen) for shape in
                      ((F_WIDTH, D), (F_WIDTH, D), (D, F_WIDTH)))
    x, counts = torch.randn(9, D, generator=gen), torch.tensor([2, 0, 5, 2])
    out = grouped_swiglu(x, counts, gate, fc, proj, grouped_mm=reference)
    assert seen == [[2, 2, 7, 9]] * 3
    assert (out - looped_swiglu(x, counts, gate, fc, proj)).abs().max().item() <= 1e-5


def test_grouped_mm_on_refuses_unaligned_widths():
    with pytest.raises(ConfigError) as err:
        MoE(12, MoEArgs(n_experts=E, top_k=2, ffn=20, grouped_mm="on"), layer=0)
    assert str(err.value) == ("model.moe.grouped_mm: on, but torch._grouped_mm needs 16-byte aligned rows: "
                              "d_model 12 and expert width 20 not a multiple of 8")


def test_auto_takes_the_grouped_kernel_only_on_hopper_class_cuda_in_bf16(monkeypatch):
    """grouped_mm=auto's choice, with the CUDA device stood in for (only attributes are read)."""
    from types import SimpleNamespace

    from llmtrain.model.moe.grouped import use_grouped_mm

    capability = [(9, 0)]
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability[0])

    def x(device="cuda", dtype=torch.bfloat16):
        return SimpleNamespace(device=torch.device(device), dtype=dtype)

    def weights(width=24, address=4096):
        return (SimpleNamespace(shape=(E, D, width), data_ptr=lambda: address),)  # proj: [E, d, f]

    assert use_grouped_mm("auto", x(), weights()) is True
    assert use_grouped_mm("auto", x(dtype=torch.float32), weights()) is False
    assert use_grouped_mm("auto", x(), weights(width=12)) is False
    assert use_grouped_mm("auto", x(), weights(address=4104)) is False
    assert use_grouped_mm("auto", x(device="cpu"), weights()) is False
    assert use_grouped_mm("off", x(), weights()) is False
    assert use_grouped_mm("on", x(device="cpu", dtype=torch.float32), weights(width=12)) is True
    capability[0] = (8, 0)
    assert use_grouped_mm("auto", x(), weights()) is False


def test_softmax_routing_and_ties_go_to_the_lower_expert():
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, 2.0, 2.0]])
    r = route(logits, 2, "softmax", True, torch.zeros(4))
    assert r.experts.tolist() == [[1, 2], [0, 1]]  # torch.topk here returns [2, 3] for the second row
    assert torch.allclose(r.weights, torch.full((2, 2), 0.5))
    unnormalized = route(logits, 2, "softmax", False, torch.zeros(4))
    p = math.exp(3) / (math.exp(1) + 2 * math.exp(3) + 1)
    assert unnormalized.weights[0].tolist() == pytest.approx([p, p], abs=1e-7)


def test_sigmoid_routing_chooses_on_biased_scores_and_weighs_by_unbiased_ones():
    block = moe(score_func="sigmoid", top_k=1, norm_topk_prob=False)
    block.router_bias[3] = 100.0  # expert 3 chosen for every token, whatever its score
    x = tokens()
    out = block(x)
    assert block.tokens_per_expert.tolist() == [0, 0, 0, 18]
    flat = x.detach().reshape(-1, D)
    score = torch.sigmoid(flat @ block.router.weight.detach()[3])
    ex = block.experts
    expert3 = F.linear(F.silu(F.linear(flat, ex.gate[3])) * F.linear(flat, ex.fc[3]), ex.proj[3])
    assert (out.reshape(-1, D) - expert3 * score[:, None]).abs().max().item() <= 1e-6


def test_z_loss_against_its_formula():
    block = moe(router_z_loss_coef=1e-3)
    x = tokens()
    block(x)
    rows = (x.detach().reshape(-1, D) @ block.router.weight.detach().T).tolist()
    expected = sum(math.log(sum(math.exp(v) for v in row)) ** 2 for row in rows) / len(rows)
    assert block.z_sum.item() == pytest.approx(expected, rel=1e-6)
    assert z_loss(torch.tensor([[0.0, 0.0]])).item() == pytest.approx(math.log(2) ** 2)


def test_a_router_forced_onto_one_expert():
    block = moe(top_k=1, router_aux_loss_coef=0.01)
    with torch.no_grad():
        block.router.weight.zero_()
        block.router.weight[2] = 10.0
    x = (tokens().detach().abs() + 0.1).requires_grad_()
    block(x).sum().backward()
    counts = block.tokens_per_expert.tolist()
    assert counts == [0, 0, 18, 0]
    assert max(counts) / (sum(counts) / E) == E  # the busiest expert's load over the mean
    assert counts.count(0) == E - 1
    # Everything on one expert with probability ~1: the balancing loss is E (1 when balanced).
    assert block.aux_sum.item() == pytest.approx(E, rel=1e-4)
    assert block.calls.item() == 1


def test_aux_loss_is_top_k_when_balanced_and_aux_sum_is_one():
    probs = torch.full((8, E), 1.0 / E)
    experts = torch.tensor([[0, 1], [2, 3]] * 4)
    assert load_balancing_loss(probs, experts).item() == pytest.approx(2.0)  # transformers' value: top_k
    skewed = torch.tensor([[0.7, 0.1, 0.1, 0.1]] * 8)
    assert load_balancing_loss(skewed, torch.tensor([[0, 1]] * 8)).item() == pytest.approx(4 * (0.7 + 0.1))
    block = moe()
    with torch.no_grad():
        block.router.weight.zero_()  # equal scores: ties go to experts 0 and 1 for every token
    block(tokens())
    assert block.tokens_per_expert.tolist() == [18, 18, 0, 0]
    # Uniform probabilities: E x sum f_i / E = top_k whatever the counts; aux_sum holds it over top_k.
    assert block.aux_sum.item() == pytest.approx(1.0)


@pytest.mark.parametrize("score_func", ["softmax", "sigmoid"])
def test_aux_loss_gradient_equals_adding_the_scaled_loss(score_func):
    coefs = dict(router_aux_loss_coef=0.5, router_z_loss_coef=0.05, score_func=score_func)
    scale = 0.37
    injected, x = moe(**coefs), tokens()
    injected.aux_loss_scale.fill_(scale)
    out = injected(x)
    injected.aux_loss_scale.fill_(5.0)  # the value the forward saw counts, as in a compiled graph
    out.sum().backward()

    direct, x2 = moe(**coefs), tokens()
    a = direct.args
    with torch.no_grad():
        direct.aux_loss_scale.fill_(0.0)  # its own injection contributes nothing
    out2 = direct(x2)
    logits = x2.reshape(-1, D).float() @ direct.router.weight.T
    r = route(logits, a.top_k, a.score_func, a.norm_topk_prob, direct.router_bias)
    aux = a.router_aux_loss_coef * load_balancing_loss(r.probs, r.experts) + a.router_z_loss_coef * z_loss(logits)
    (out2.sum() + scale * aux).backward()
    assert (out - out2).abs().max().item() == 0
    assert_close(grads(injected, x), grads(direct, x2), 1e-6)
    # The aux term moves the router's gradient well past the tolerance: the comparison can fail.
    plain = moe(score_func=score_func)
    plain(tokens()).sum().backward()
    assert (plain.router.weight.grad - injected.router.weight.grad).abs().max().item() > 1e-3


@pytest.mark.parametrize("reentrant", [False, True])
def test_statistics_are_not_counted_again_under_activation_recompute(reentrant):
    coefs = dict(router_aux_loss_coef=0.5, router_z_loss_coef=0.05)
    plain, x = moe(**coefs), tokens()
    plain(x).sum().backward()
    recomputed, x2 = moe(**coefs), tokens()
    checkpoint(recomputed, x2, use_reentrant=reentrant).sum().backward()
    assert recomputed.calls.item() == 1
    assert recomputed.tokens_per_expert.tolist() == plain.tokens_per_expert.tolist()
    assert sum(recomputed.tokens_per_expert.tolist()) == 18 * 2
    assert recomputed.aux_sum.item() == plain.aux_sum.item()
    assert recomputed.z_sum.item() == plain.z_sum.item()
    # The auxiliary losses' gradient arrives once with recompute too.
    assert_close(grads(plain, x), grads(recomputed, x2), 1e-6)


def test_reset_stats_and_reset_buffers():
    block = moe(bias_update_rate=0.1)
    block(tokens())
    block(tokens(seed=2))
    assert block.calls.item() == 2 and sum(block.tokens_per_expert.tolist()) == 2 * 18 * 2
    block.update_bias(torch.tensor([1, 0, 0, 0]))
    block.aux_loss_scale.fill_(4.0)
    block.reset_stats()
    assert block.calls.item() == 0 and block.tokens_per_expert.tolist() == [0] * E
    assert block.aux_sum.item() == 0 and block.z_sum.item() == 0
    assert block.router_bias.abs().sum() > 0
    block.reset_buffers()
    assert block.router_bias.tolist() == [0.0] * E and block.aux_loss_scale.item() == 1.0
    # Only the bias is saved with the weights; the scale and statistics are not.
    assert sorted(k for k in block.state_dict() if "weight" not in k and "experts" not in k) == ["router_bias"]


def test_bias_update_direction():
    block = moe(bias_update_rate=0.1)
    block.update_bias(torch.tensor([10, 0, 5, 5]))  # mean 5
    assert block.router_bias.tolist() == pytest.approx([-0.1, 0.1, 0.0, 0.0])
    block.update_bias(torch.tensor([10, 0, 5, 5]))
    assert block.router_bias.tolist() == pytest.approx([-0.2, 0.2, 0.0, 0.0])
    still = moe(bias_update_rate=0.0)
    still.update_bias(torch.tensor([10, 0, 5, 5]))
    assert still.router_bias.tolist() == [0.0] * E


def test_bias_balancing_spreads_a_collapsed_router():
    """Every token on expert 0 (sigmoid scores, its bias 1.0 ahead): the bias updates spread them out."""
    block = moe(score_func="sigmoid", top_k=1, bias_update_rate=0.05)
    block.router_bias[0] = 1.0
    x = tokens(b=4, t=16).detach()
    loads = []
    for _ in range(20):
        block.reset_stats()
        block(x)
        loads.append(block.tokens_per_expert.tolist())
        block.update_bias(block.tokens_per_expert)
    assert loads[0] == [64, 0, 0, 0]
    assert max(loads[-1]) <= 32 and 0 not in loads[-1]


@pytest.mark.parametrize("mode", ["off", "on"])
def test_two_runs_are_bit_identical(mode):
    results = [run(moe(grouped_mm=mode, n_shared_experts=1, router_aux_loss_coef=0.1), tokens()) for _ in range(2)]
    (out_a, g_a), (out_b, g_b) = results
    assert torch.equal(out_a, out_b)
    assert all(torch.equal(g_a[k], g_b[k]) for k in g_a)


def test_parameter_names_and_shapes():
    block = moe(n_shared_experts=2)
    shapes = {name: tuple(p.shape) for name, p in block.named_parameters()}
    assert shapes == {"router.weight": (E, D), "experts.gate": (E, F_WIDTH, D), "experts.fc": (E, F_WIDTH, D),
                      "experts.proj": (E, D, F_WIDTH), "shared.gate.weight": (2 * F_WIDTH, D),
                      "shared.fc.weight": (2 * F_WIDTH, D), "shared.proj.weight": (D, 2 * F_WIDTH)}
    assert moe().shared is None
    holder = torch.nn.ModuleDict({"a": moe(), "b": torch.nn.Linear(2, 2), "c": moe()})
    assert moe_modules(holder) == [holder["a"], holder["c"]]


def test_output_dtype_follows_the_input():
    block = moe(n_shared_experts=1).to(torch.bfloat16)
    x = tokens().detach().to(torch.bfloat16)
    assert block(x).dtype == torch.bfloat16


def test_sparse_layers_follow_n_dense_layers_and_sparse_every():
    args = MoEArgs(n_experts=E, top_k=2, ffn=F_WIDTH, n_dense_layers=1, sparse_every=2)
    assert [i for i in range(8) if args.is_sparse(i)] == [1, 3, 5, 7]
    args = MoEArgs(n_experts=E, top_k=2, ffn=F_WIDTH, n_dense_layers=3, sparse_every=2)
    assert [i for i in range(8) if args.is_sparse(i)] == [3, 5, 7]
    assert [i for i in range(4) if MoEArgs(n_experts=E, top_k=2, ffn=8).is_sparse(i)] == [0, 1, 2, 3]


def test_compiled_with_recompute_counts_once_in_one_graph():
    """torch.compile (aot_eager: dynamo's tracing and autograd, no C++ compile) of a checkpointed block on the
    grouped bf16 path: one graph, no break (the recompute check stays out of the trace); with dynamo told not to
    replay forward side effects in backward, the statistics count once and the gradients equal eager's."""
    from torch._dynamo.utils import counters

    class Block(torch.nn.Module):
        def __init__(self, mlp: MoE):
            super().__init__()
            self.mlp = mlp

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.mlp(x)

    coefs = dict(router_aux_loss_coef=0.5, router_z_loss_coef=0.05, grouped_mm="on")
    eager = moe(**coefs).to(torch.bfloat16)
    x = tokens().detach().to(torch.bfloat16).requires_grad_()
    Block(eager)(x).float().sum().backward()

    compiled = moe(**coefs).to(torch.bfloat16)
    block = checkpoint_wrapper(Block(compiled))
    block.compile(backend="aot_eager")
    counters.clear()
    with torch._dynamo.config.patch(skip_fwd_side_effects_in_bwd_under_checkpoint=True):
        x2 = tokens().detach().to(torch.bfloat16).requires_grad_()
        block(x2).float().sum().backward()
    assert not counters["graph_break"]
    assert counters["frames"]["ok"] == 1
    assert compiled.calls.item() == 1
    assert compiled.tokens_per_expert.tolist() == eager.tokens_per_expert.tolist()
    assert all(torch.equal(a, b) for a, b in zip(grads(compiled, x2).values(), grads(eager, x).values()))


def test_grouped_experts_run_in_autocasts_dtype():
    """Under autocast the block's input is the norm's fp32 output; the grouped kernel, which autocast does not
    cover, runs in bf16 as the looped F.linear calls do, so `auto` can pick it on a GPU."""
    from llmtrain.model.moe.grouped import compute_dtype

    x = torch.randn(12, D)
    counts = torch.tensor([3, 0, 5, 4])
    block = moe()
    w = (block.experts.gate, block.experts.fc, block.experts.proj)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert compute_dtype(x) == torch.bfloat16
        grouped, looped = grouped_swiglu(x, counts, *w), looped_swiglu(x, counts, *w)
    assert compute_dtype(x) == torch.float32
    assert grouped.dtype == looped.dtype == torch.bfloat16
    torch.testing.assert_close(grouped.float(), looped.float(), rtol=2e-2, atol=2e-2)
