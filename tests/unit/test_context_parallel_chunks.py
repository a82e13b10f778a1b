"""Context parallel's split of a sequence (parallel/context_parallel.py) and its attention over the rank's chunks,
in one process: every position held once, the balance of the head-tail chunks, the inverse order, and each
rank's attention output equal to one process's causal attention at its positions (the gather of keys and values
simulated by handing the core the whole sequence's)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from llmtrain.parallel.context_parallel import (
    ContextParallelCore,
    chunk_bounds,
    rank_positions,
    sequence_order,
)

CASES = [(8, 1), (8, 2), (16, 4), (24, 2), (24, 3), (40, 4)]


@pytest.mark.parametrize("seq_len, cp", CASES)
def test_every_position_is_held_once_and_the_order_restores_the_sequence(seq_len, cp):
    held = [rank_positions(seq_len, cp, r) for r in range(cp)]
    assert all(len(h) == seq_len // cp for h in held)
    gathered = torch.cat(held)
    assert sorted(gathered.tolist()) == list(range(seq_len))
    assert gathered[sequence_order(seq_len, cp)].tolist() == list(range(seq_len))
    x = torch.arange(3 * seq_len).view(3, seq_len) * 10
    parts = [x[:, rank_positions(seq_len, cp, r)] for r in range(cp)]  # what the trainer hands each rank
    assert torch.equal(torch.cat(parts, dim=1)[:, sequence_order(seq_len, cp)], x)


def test_head_tail_chunks_balance_the_causal_work():
    """Rank r holds chunks r and 2cp-1-r: the keys each rank's queries attend (the causal work) are equal."""
    seq_len, cp = 32, 4
    assert chunk_bounds(seq_len, cp, 0) == [(0, 4), (28, 32)]
    assert chunk_bounds(seq_len, cp, 3) == [(12, 16), (16, 20)]
    work = [sum(p + 1 for p in rank_positions(seq_len, cp, r).tolist()) for r in range(cp)]
    assert len(set(work)) == 1, work


class _Mesh:
    def __init__(self, size, rank):
        self._size, self._rank = size, rank

    def get_group(self):
        return None

    def size(self):
        return self._size

    def get_local_rank(self):
        return self._rank


@pytest.mark.parametrize("seq_len, cp, kv_heads", [(16, 2, 4), (24, 3, 2), (32, 4, 1)])
def test_each_rank_attends_like_one_process_at_its_positions(seq_len, cp, kv_heads, monkeypatch):
    g = torch.Generator().manual_seed(cp)
    b, heads, d = 2, 4, 8
    q = torch.randn(b, heads, seq_len, d, generator=g)
    k, v = (torch.randn(b, kv_heads, seq_len, d, generator=g) for _ in range(2))
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=heads != kv_heads)
    for r in range(cp):
        core = ContextParallelCore(_Mesh(cp, r), seq_len, 0.0, nn.Module())
        local = rank_positions(seq_len, cp, r)
        mine_k, mine_v = k[:, :, local], v[:, :, local]
        whole = {id(mine_k): k, id(mine_v): v}
        monkeypatch.setattr(core, "_whole", lambda t: whole[id(t)])
        got = core(q[:, :, local], mine_k, mine_v)
        torch.testing.assert_close(got, expected[:, :, local], rtol=0, atol=1e-6)
