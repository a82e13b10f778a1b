"""Expert parallel's exchange (parallel/expert_dispatch.py) over P simulated ranks in one process: each rank a
thread, the all-to-all a barrier-synchronized swap of the split tensors (differentiable, as the real one is).

Each rank's tokens go through sort -> exchange plan -> to_experts -> its own experts' slice -> from_experts ->
combine, and must give the outputs and gradients (inputs and every expert's weights) that one process with all
experts computes for the same tokens. Uneven counts: an expert no token picks, a rank none of whose experts is
picked, ranks with different token counts.
"""

from __future__ import annotations

import threading

import pytest
import torch

from llmtrain.model.moe.dispatch import combine, sort_by_expert, sorted_tokens
from llmtrain.model.moe.experts import grouped_swiglu, looped_swiglu
from llmtrain.parallel.expert_dispatch import from_experts, plan_exchange, to_experts

E, D, F, K = 8, 8, 8, 2  # widths a multiple of 8: torch._grouped_mm needs 16-byte aligned rows


class SimulatedGroup:
    """all_to_all among `ranks` threads: rank r sends chunk s of its input to rank s."""

    def __init__(self, ranks: int):
        self.ranks = ranks
        self.slots: list = [None] * ranks
        self.barrier = threading.Barrier(ranks)

    def all_to_all_for(self, rank: int):
        def exchange(x, output_splits, input_splits):
            self.slots[rank] = torch.split(x, input_splits)
            self.barrier.wait()
            out = torch.cat([self.slots[s][rank] for s in range(self.ranks)])
            assert out.shape[0] == sum(output_splits)
            self.barrier.wait()  # every rank has taken its chunks before the slots are reused
            return out
        return exchange


def _weights(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=g, requires_grad=True) for shape in ((E, F, D), (E, F, D), (E, D, F))]


def _reference(x, experts, route_weights, weights, run):
    """One process with every expert."""
    dispatch = sort_by_expert(experts, E)
    out = run(sorted_tokens(x, dispatch, K), dispatch.counts, *weights)
    return combine(out, dispatch, route_weights)


def _rank_forward(rank, ranks, x, experts, route_weights, weights, received_counts, exchange_fn, run, outs):
    local = E // ranks
    dispatch = sort_by_expert(experts, E)
    plan = plan_exchange(dispatch.counts, received_counts)
    mine = [w[rank * local:(rank + 1) * local] for w in weights]
    received = to_experts(sorted_tokens(x, dispatch, K), plan, exchange_fn)
    back = from_experts(run(received, plan.local_counts, *mine), plan, exchange_fn)
    outs[rank] = (combine(back, dispatch, route_weights), plan)


def _cases(ranks: int):
    """Per rank: tokens, their k experts and routing weights. Expert 5 is never picked; with 4 ranks no token
    picks experts 2 or 3 (rank 1's); rank sizes differ."""
    g = torch.Generator().manual_seed(ranks)
    allowed = [e for e in range(E) if e != 5 and not (ranks == 4 and e in (2, 3))]
    cases = []
    for r in range(ranks):
        n = 3 + 2 * r
        choice = torch.stack([torch.randperm(len(allowed), generator=g)[:K] for _ in range(n)])
        experts = torch.tensor(allowed)[choice]
        cases.append((torch.randn(n, D, generator=g, requires_grad=True), experts,
                      torch.softmax(torch.randn(n, K, generator=g), dim=-1)))
    return cases


@pytest.mark.parametrize("ranks", [2, 4])
@pytest.mark.parametrize("path", ["looped", "grouped"])
def test_exchange_matches_one_process(ranks, path):
    if path == "grouped" and not hasattr(torch, "_grouped_mm"):
        pytest.skip("this torch has no torch._grouped_mm")
    run = looped_swiglu if path == "looped" else grouped_swiglu
    cases = _cases(ranks)
    weights = _weights()
    expected = [_reference(x, ex, w, weights, run) for x, ex, w in cases]
    loss = sum((o * (i + 1)).sum() for i, o in enumerate(expected))
    ref_grads = torch.autograd.grad(loss, [c[0] for c in cases] + weights)

    counts = [sort_by_expert(ex, E).counts for _, ex, _ in cases]
    local = E // ranks
    group, outs, threads = SimulatedGroup(ranks), [None] * ranks, []
    for r, (x, ex, w) in enumerate(cases):
        received = torch.stack([c[r * local:(r + 1) * local] for c in counts])
        threads.append(threading.Thread(target=_rank_forward, args=(r, ranks, x, ex, w, weights, received,
                                                                     group.all_to_all_for(r), run, outs)))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(o is not None for o in outs), "a simulated rank failed"
    got = [o for o, _ in outs]
    for r in range(ranks):
        torch.testing.assert_close(got[r], expected[r], rtol=0, atol=1e-5)
    grads = torch.autograd.grad(sum((o * (i + 1)).sum() for i, o in enumerate(got)), [c[0] for c in cases] + weights)
    for a, b in zip(grads, ref_grads):
        # The weights' gradients add the ranks' pairs in another order: float rounding only.
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-5)

    plans = [p for _, p in outs]
    # Every pair travels once: what rank r sends to s is what s receives from r.
    for r in range(ranks):
        for s in range(ranks):
            assert plans[r].send_splits[s] == plans[s].recv_splits[r]
        assert sum(plans[r].send_splits) == cases[r][0].shape[0] * K
    # The unpicked expert holds no pair; with 4 ranks, rank 1 receives none.
    owner = 5 // local
    assert plans[owner].local_counts[5 % local].item() == 0
    if ranks == 4:
        assert plans[1].recv_splits == [0] * 4 and plans[1].local_counts.tolist() == [0, 0]


def test_plan_orders_received_pairs_by_local_expert_then_source():
    """Two ranks send to a rank holding experts 0 and 1: rank 0 sends 2 pairs to expert 0 and 1 to expert 1,
    rank 1 sends 0 and 2. Received rows (source-major) 0,1 | 2 | 3,4 go to expert order 0,1 | 2,3,4."""
    received = torch.tensor([[2, 1], [0, 2]])
    plan = plan_exchange(torch.tensor([2, 1, 0, 0]), received)
    assert plan.send_splits == [3, 0] and plan.recv_splits == [3, 2]
    assert plan.order.tolist() == [0, 1, 2, 3, 4] and plan.local_counts.tolist() == [2, 3]
    received = torch.tensor([[1, 1], [2, 0]])  # rows: s0e0, s0e1, s1e0, s1e0
    plan = plan_exchange(torch.tensor([1, 1, 0, 0]), received)
    assert plan.order.tolist() == [0, 2, 3, 1] and plan.local_counts.tolist() == [3, 1]
