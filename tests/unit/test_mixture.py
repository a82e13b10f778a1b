"""data=mix: the mixture's sample schedule, the per-source window order, the loader over shards and huge files,
resume with changed weights, and (slow) training under dp=2 with per-source metrics and a resume."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from helpers.token_shards import write_shards, write_tokens  # noqa: F401
from omegaconf import OmegaConf

from llmtrain.data import DataError, batch_indices
from llmtrain.data.mixture import MixtureSchedule, SegmentDraws
from llmtrain.data.mixture_config import source_names
from llmtrain.data.mixture_data import MixtureData, MixtureSource, SourceTokens
from llmtrain.data.permutation import FeistelPermutation
from llmtrain.data.token_source import inspect_token_source
from llmtrain.train.trackers.base import scalars


SEQ = 8


def mixture_data(sources, seq_len=SEQ, val_fraction=0.1, seed=0, vocab=1 << 16) -> MixtureData:
    data = OmegaConf.create({"name": "mix", "sources": sources, "dtype": None, "val_fraction": val_fraction})
    model = OmegaConf.create({"seq_len": seq_len, "vocab_size": vocab})
    return MixtureData(data, model, seed)


# ---- the schedule ------------------------------------------------------------------------------------------------
WEIGHT_SETS = [
    {"a": 0.7, "b": 0.3},
    {"a": 0.5, "b": 0.3, "c": 0.2},
    {"a": 0.98, "b": 0.02},
    {"only": 1.0},
    {f"s{i}": float(i + 1) for i in range(8)},
    {f"s{i}": w for i, w in enumerate([0.3, 0.01, 0.2, 0.0, 0.15, 0.05, 0.25, 0.04])},
]


@pytest.mark.parametrize("weights", WEIGHT_SETS, ids=lambda w: "-".join(map(str, w.values()))[:40])
def test_any_1000_consecutive_samples_hold_each_source_within_2_points_of_its_weight(weights):
    n, window = 50_000, 1000
    schedule = MixtureSchedule.fresh(weights)
    names = list(weights)
    drawn = np.array([names.index(schedule.draw(i)[0]) for i in range(n)])
    total = sum(weights.values())
    worst = 0.0
    for s, name in enumerate(names):
        running = np.concatenate([[0], np.cumsum(drawn == s)])
        shares = (running[window:] - running[:-window]) / window
        worst = max(worst, float(np.abs(shares - weights[name] / total).max()))
    assert worst <= 0.02
    # The counts of the first n samples are the draws, and they sum to n.
    consumed = schedule.consumed(n)
    assert consumed == {name: int((drawn == s).sum()) for s, name in enumerate(names)}
    assert sum(consumed.values()) == n
    assert all(abs(consumed[name] - n * weights[name] / total) < 2 for name in names)


def test_a_draw_is_a_pure_function_of_the_index_and_positions_count_up_per_source():
    weights = {"a": 0.5, "b": 0.3, "c": 0.2}
    sequential = MixtureSchedule.fresh(weights)
    draws = [sequential.draw(n) for n in range(5000)]
    shuffled = MixtureSchedule.fresh(weights)
    order = np.random.default_rng(1).permutation(5000)[:800]
    assert all(shuffled.draw(int(n)) == draws[n] for n in order)  # any access order, any cache state
    seen: dict[str, list[int]] = {}
    for name, position in draws:
        seen.setdefault(name, []).append(position)
    assert all(positions == list(range(len(positions))) for positions in seen.values())
    for n in (0, 1, 999, 1024, 3333, 5000):
        assert sequential.consumed(n) == {k: sum(1 for name, _ in draws[:n] if name == k) for k in weights}


def test_block_quotas_are_never_negative_and_small_weights_widen_the_block():
    draws = SegmentDraws([0.999, 0.001])
    assert draws.block >= 2048 and draws.block * 0.001 >= 2
    for b in range(40):
        sources, _ = draws._block(b)
        for s in (0, 1):
            quota = draws.count(s, (b + 1) * draws.block) - draws.count(s, b * draws.block)
            assert quota >= 0 and sources.count(s) == quota
    with pytest.raises(DataError, match="data.sources: a weight of 1e-09"):
        MixtureSchedule.fresh({"a": 1.0, "b": 1e-9})
    with pytest.raises(DataError, match="data.sources"):
        MixtureSchedule.fresh({"a": 0.0, "b": 0.0})
    with pytest.raises(DataError, match="data.sources"):
        MixtureSchedule.fresh({"a": -1.0, "b": 2.0})


def test_a_weight_change_starts_a_segment_without_replaying_any_sample():
    old = MixtureSchedule.fresh({"web": 0.7, "code": 0.3})
    at = 10_000 + 37
    before = [old.draw(n) for n in range(at)]
    same, changed = old.continued({"code": 3.0, "web": 7.0}, at)  # same weights (by name): the same history
    assert same is old and not changed
    new, changed = old.continued({"web": 0.2, "code": 0.5, "math": 0.3}, at)
    assert changed and [seg.start for seg in new.segments] == [0, at]
    assert [new.draw(n) for n in range(at)] == before  # the past is unchanged
    after = [new.draw(n) for n in range(at, at + 20_000)]
    positions: dict[str, list[int]] = {}
    for name, position in before + after:
        positions.setdefault(name, []).append(position)
    # Every source's samples are 0, 1, 2, ... across the change: none drawn twice, none skipped.
    assert all(p == list(range(len(p))) for p in positions.values())
    assert new.consumed(at + 20_000) == {name: len(p) for name, p in positions.items()}
    assert sum(1 for name, _ in after if name == "math") == pytest.approx(6000, abs=2)
    # A dropped source stops, and keeps its count.
    dropped, _ = new.continued({"web": 1.0}, at + 20_000)
    assert {dropped.draw(n)[0] for n in range(at + 20_000, at + 21_000)} == {"web"}
    assert dropped.consumed(at + 21_000)["code"] == len(positions["code"])
    # The history survives JSON (as in a checkpoint).
    again = MixtureSchedule.from_json(json.loads(json.dumps(new.to_json())))
    assert [again.draw(n) for n in range(at - 5, at + 5)] == [new.draw(n) for n in range(at - 5, at + 5)]


# ---- the window order --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [1, 2, 3, 7, 64, 1000, 4097])
def test_the_feistel_order_is_a_permutation(n):
    for seed in (0, 1, 12345):
        order = FeistelPermutation(n, seed, "web", 0)
        assert sorted(order(i) for i in range(n)) == list(range(n))
        assert all(order.inverse(order(i)) == i for i in range(n))
    if n >= 64:
        assert [FeistelPermutation(n, 0, "web", 0)(i) for i in range(n)] != \
            [FeistelPermutation(n, 0, "web", 1)(i) for i in range(n)]


def test_a_billion_windows_cost_no_memory():
    order = FeistelPermutation(10**9, 3, "big", 0)
    values = [order(i) for i in range(0, 10**9, 10**7)]
    assert len(set(values)) == len(values) and all(0 <= v < 10**9 for v in values)


def test_no_window_repeats_within_an_epoch_and_the_next_epoch_reshuffles(tmp_path):
    path = write_tokens(tmp_path / "a.bin", np.arange(1000) % 50000)
    source = MixtureSource("a", inspect_token_source(path), SEQ, 0.1, seed=5, token_limit=1 << 16)
    n = source.train_windows
    assert n == (900 - 1) // SEQ
    epoch0 = [source.train_window(p) for p in range(n)]
    epoch1 = [source.train_window(p) for p in range(n, 2 * n)]
    assert sorted(epoch0) == sorted(epoch1) == list(range(n)) and epoch0 != epoch1
    first = source.train_sample(0)
    assert first.tolist() == list(range(epoch0[0] * SEQ, epoch0[0] * SEQ + SEQ + 1))


def test_epochs_started_names_each_new_epoch_once(tmp_path):
    data = mixture_data([{"path": write_tokens(tmp_path / "a.bin", np.arange(400)), "weight": 1}])
    n = data.sources["a"].train_windows
    assert data.epochs_started({"a": 0}, {"a": n}) == []
    assert data.epochs_started({"a": n - 1}, {"a": n + 1}) == [("a", 1)]
    assert data.epochs_started({"a": n}, {"a": 3 * n + 1}) == [("a", 1), ("a", 2), ("a", 3)]


# ---- the loader --------------------------------------------------------------------------------------------------
def test_windows_span_shard_boundaries(tmp_path):
    tokens = np.arange(500) % 65000
    folder = write_shards(tmp_path / "web", [tokens[:13], tokens[13:14], [], tokens[14:300], tokens[300:]])
    reader = SourceTokens(inspect_token_source(folder))
    for start in (0, 5, 12, 13, 14, 290, 491):
        assert reader.read(start, 9).tolist() == tokens[start:start + 9].tolist()
    data = mixture_data([{"path": folder, "weight": 1.0}])
    source = data.sources["web"]
    for position in range(source.train_windows):
        w = source.train_window(position)
        assert source.train_sample(position).tolist() == tokens[w * SEQ: w * SEQ + SEQ + 1].tolist()
    assert source.val_sample(0).tolist() == tokens[450:459].tolist()


def test_a_source_past_2_pow_32_tokens_and_4_gib(tmp_path):
    path = tmp_path / "huge.bin"
    num_tokens = 2**32 + 1000
    with open(path, "wb") as f:
        f.truncate(num_tokens * 2)  # 8 GiB, sparse: zeros
        far = 2**32 + 100
        f.seek(far * 2)
        f.write(np.arange(1, 41, dtype=np.uint16).tobytes())
    source = inspect_token_source(str(path))
    assert source.num_tokens == num_tokens and os.path.getsize(path) > 4 * 2**30
    assert SourceTokens(source).read(far - 2, 6).tolist() == [0, 0, 1, 2, 3, 4]
    data = mixture_data([{"path": str(path), "weight": 1.0, "name": "huge"}], val_fraction=1e-7)
    huge = data.sources["huge"]
    assert huge.train_windows > 2**32 // SEQ
    window = far // SEQ  # the window holding the written tokens, past token 2**32
    position = huge.order(0).inverse(window)
    start = window * SEQ
    expected = [t - far + 1 if 0 <= t - far < 40 else 0 for t in range(start, start + SEQ + 1)]
    assert huge.train_sample(position).tolist() == expected and sum(expected) > 0
    # One source: global sample n is that source's position n.
    x, y = data.train_batch([position])
    assert x[0].tolist() == expected[:-1] and y[0].tolist() == expected[1:]


def test_every_layout_reads_the_same_samples(tmp_path):
    a = write_tokens(tmp_path / "a.bin", np.arange(3000) % 50000)
    b = write_shards(tmp_path / "b", [np.arange(7000, 7800), np.arange(7800, 9000)])
    data = mixture_data([{"path": a, "weight": 0.6}, {"path": b, "weight": 0.4, "name": "bee"}])
    assert data.names == ["a", "bee"]
    g, offset = 16, 48

    def global_rows(dp, mb):
        accum = g // (dp * mb)
        parts = {}
        for m in range(accum):
            for r in range(dp):
                idx = batch_indices(3, m, r, dp, mb, g, sample_offset=offset)
                parts.update(zip(idx, data.train_batch(idx)[0]))
        return torch.stack([parts[i] for i in sorted(parts)])

    one = global_rows(1, 16)
    assert torch.equal(one, global_rows(2, 2)) and torch.equal(one, global_rows(4, 1))
    x, y = data.train_batch([offset])
    assert torch.equal(x[0, 1:], y[0, :-1])


def test_bad_sources_are_one_line_errors(tmp_path):
    a = write_tokens(tmp_path / "a.bin", np.arange(300))
    with pytest.raises(DataError, match=r"data.sources: source names must be unique"):
        mixture_data([{"path": a}, {"path": a}])
    with pytest.raises(DataError, match=r"data.sources\[1\].path"):
        mixture_data([{"path": a}, {"path": str(tmp_path / "missing.bin")}])
    data = mixture_data([{"path": write_tokens(tmp_path / "big.bin", [70000] * 300, np.uint32)}], vocab=1000)
    with pytest.raises(DataError, match=r"data.sources: source .big.: .* holds token id \d+ .*read as uint16"):
        data.train_batch([0])


def test_source_names():
    assert source_names([{"path": "/d/code.bin"}, {"path": "web/"}, {"path": "x", "name": "named"},
                         {"path": "~/.hidden"}, {"path": "a.tar.gz"}]) == ["code", "web", "named", ".hidden", "a"]


def test_trackers_get_one_scalar_per_source():
    train = {"step": 3, "loss": 2.0, "data_wait_ms": 0.5, "source_tokens": {"web": 640, "code": 384}}
    assert scalars(train) == {"train/loss": 2.0, "data_wait_ms": 0.5, "source_tokens/web": 640,
                              "source_tokens/code": 384}
    val = {"step": 3, "val_loss": 2.5, "source_val_loss": {"web": 2.25, "code": float("nan")}}
    assert scalars(val) == {"val/loss": 2.5, "val_loss/web": 2.25}


def test_the_data_feed_keeps_the_old_sample_stream_for_one_dataset():
    from llmtrain.data import SampleStream, SyntheticDataset
    from llmtrain.train.data_feed import DataFeed

    cfg = OmegaConf.create({"data": {"name": "synthetic"}, "model": {"seq_len": SEQ, "vocab_size": 97},
                            "train": {"seed": 4, "micro_batch_size": 2, "global_batch_size": 8}})
    feed = DataFeed(cfg, torch.device("cpu"), dp_rank=1, dp_size=2)
    stream = SampleStream(SyntheticDataset(SEQ, 97, 4), 4)
    got = feed.train_batch(2, 1, samples_seen=40)
    want = stream.batch("train", 2, 1, 1, 2, 2, 8, sample_offset=40)
    assert all(torch.equal(g, w) for g, w in zip(got, want))
    assert feed.source_tokens(40) is None and feed.state(40) is None
    assert feed.step_done(3, 40, 48) == [] and feed.take_wait_ms() > 0 and feed.take_wait_ms() == 0


# ---- end to end (slow) -------------------------------------------------------------------------------------------


def test_step_log_rows_and_console_lines_carry_the_data_fields(tmp_path):
    from llmtrain.train.evaluation import EvalResult
    from llmtrain.rundir.metrics_file import read_metrics
    from llmtrain.train.metrics import MetricsWriter
    from llmtrain.train.step_log import StepLog

    class Feed:
        def __init__(self):
            self.waits = iter([1.5, 0.25])

        def take_wait_ms(self):
            return next(self.waits)

        def source_tokens(self, samples_seen):
            return {"web": 48 * samples_seen, "code": 16 * samples_seen}

    lines = []
    train_cfg = SimpleNamespace(log_interval=2, max_steps=4, warmup_steps=1, lr=1e-3, min_lr=1e-4)
    scaler = SimpleNamespace(enabled=False)
    metrics = MetricsWriter(str(tmp_path / "metrics.jsonl"))
    log = StepLog(train_cfg, metrics, lambda line, **_: lines.append(line), 256, 1.0, None, 1, scaler,
                  lambda: 0.5, Feed())
    result = SimpleNamespace(loss=2.0, grad_norm=1.0, moe=None)
    for step in (1, 2, 3):
        log.step_done(step, result, 0.1, 256 * step, 0.1 * step, samples_seen=4 * step)
    log.eval_done(3, EvalResult(2.5, {"web": 2.25, "code": 3.25}))
    metrics.close()
    rows = read_metrics(str(tmp_path / "metrics.jsonl"))
    assert [(r["step"], r["data_wait_ms"], r["source_tokens"]) for r in rows if "loss" in r] == \
        [(1, 1.5, {"web": 192, "code": 64}), (2, 0.25, {"web": 384, "code": 128})]
    assert rows[-1] == {"step": 3, "val_loss": 2.5, "source_val_loss": {"web": 2.25, "code": 3.25}}
    assert lines[-1] == "step      3/4 | val_loss 2.5000 | web 2.2500 code 3.2500"
