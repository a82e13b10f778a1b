"""The data=mix loader: each source's files memory-mapped, its windows visited in a seeded per-epoch order, and
the global sample stream (llmtrain.data.mixture) turned into batches.

A source's tokens are the concatenation of its files (one token file, or the shards of a folder); the first
1 - data.val_fraction of them are its train region, the rest its val region, as MemmapDataset splits one file.
Windows are seq_len+1 tokens at stride seq_len and may span a shard boundary. Train position p of a source reads
window order_e(p % N) of epoch e = p // N, order_e a seeded bijection (train.seed, source name, epoch)."""

from __future__ import annotations

import sys

import numpy as np
import torch

from .errors import DataError
from .mixture import MixtureSchedule
from .mixture_config import source_names
from .permutation import FeistelPermutation
from .source_tokens import SourceTokens
from .token_source import TokenSource, check_token_source
from .tokenfile import num_windows, split_sizes

class MixtureSource:
    """One source of the mixture: its train windows in per-epoch seeded order, its val windows in order."""

    def __init__(self, name: str, source: TokenSource, seq_len: int, val_fraction: float, seed: int,
                 token_limit: int):
        self.name = name
        self.tokens = SourceTokens(source)
        self.seq_len = int(seq_len)
        self.seed = int(seed)
        train_tokens, val_tokens = split_sizes(source.num_tokens, val_fraction)
        self.val_start = train_tokens
        self.train_windows = num_windows(train_tokens, seq_len)
        self.val_windows = num_windows(val_tokens, seq_len)
        self.limit = source.vocab_size if source.vocab_size is not None else token_limit
        self._order: tuple[int, FeistelPermutation] | None = None

    def order(self, epoch: int) -> FeistelPermutation:
        if self._order is None or self._order[0] != epoch:
            self._order = (epoch, FeistelPermutation(self.train_windows, "mix-order", self.seed, self.name, epoch))
        return self._order[1]

    def train_window(self, position: int) -> int:
        epoch, index = divmod(position, self.train_windows)
        return self.order(epoch)(index)

    def train_sample(self, position: int) -> np.ndarray:
        return self._window(self.train_window(position) * self.seq_len)

    def val_sample(self, index: int) -> np.ndarray:
        if not self.val_windows:
            raise DataError("data.val_fraction", f"source {self.name!r} ({self.tokens.path}) has no val sample of "
                                                 f"{self.seq_len + 1} tokens; raise data.val_fraction")
        return self._window(self.val_start + (index % self.val_windows) * self.seq_len)

    def _window(self, start: int) -> np.ndarray:
        tokens = self.tokens.read(start, self.seq_len + 1)
        biggest = int(tokens.max())
        if biggest >= self.limit:
            raise DataError("data.sources", f"source {self.name!r}: {self.tokens.path} holds token id {biggest} "
                                            f"(near token {start}, read as {self.tokens.dtype}) but ids must be "
                                            f"below {self.limit}; prepare it again or fix model.vocab_size")
        return tokens


def _rows_to_batch(rows: list[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
    rows = torch.from_numpy(np.stack(rows))
    return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()


class MixtureData:
    """The sources of data.sources and the schedule that draws from them."""

    def __init__(self, data_cfg, model_cfg, seed: int):
        if sys.byteorder != "little":
            raise DataError("data.sources", "token files are little-endian; this host is big-endian")
        sources = list(data_cfg.sources or [])
        if not sources:
            raise DataError("data.sources", "data=mix needs at least one source: [{path: ..., weight: ...}]")
        names = source_names(sources)
        if len(set(names)) != len(names):
            raise DataError("data.sources", f"source names must be unique, got {names}; give each a `name`")
        self.sources: dict[str, MixtureSource] = {}
        for i, (name, entry) in enumerate(zip(names, sources)):
            info = check_token_source(str(entry["path"]), dtype=data_cfg.dtype, seq_len=int(model_cfg.seq_len),
                                      val_fraction=float(data_cfg.val_fraction),
                                      model_vocab=int(model_cfg.vocab_size), need_val=False,
                                      key=f"data.sources[{i}].path")
            self.sources[name] = MixtureSource(name, info, model_cfg.seq_len, data_cfg.val_fraction, seed,
                                               int(model_cfg.vocab_size))
        self.weights = {name: float(entry.get("weight", 1.0)) for name, entry in zip(names, sources)}
        self.schedule = MixtureSchedule.fresh(self.weights)

    @property
    def names(self) -> list[str]:
        return list(self.sources)

    def resume(self, segments: list[dict], samples_seen: int) -> bool:
        """Continue the saved history at samples_seen with this run's weights; whether a new segment began."""
        self.schedule, changed = MixtureSchedule.from_json(segments).continued(self.weights, samples_seen)
        return changed

    def draw(self, n: int) -> tuple[MixtureSource, int]:
        name, position = self.schedule.draw(n)
        source = self.sources.get(name)
        if source is None:
            raise DataError("data.sources", f"sample {n} draws from source {name!r}, which data.sources no longer "
                                            "lists")
        return source, position

    def train_batch(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        rows = []
        for n in indices:
            source, position = self.draw(n)
            rows.append(source.train_sample(position))
        return _rows_to_batch(rows)

    def val_batch(self, name: str, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        source = self.sources[name]
        return _rows_to_batch([source.val_sample(i) for i in indices])

    def epochs_started(self, before: dict[str, int], after: dict[str, int]) -> list[tuple[str, int]]:
        """(name, epoch) of each epoch (after the first) some source began between two consumed counts."""
        started = []
        for name, source in self.sources.items():
            lo, hi, n = before.get(name, 0), after.get(name, 0), source.train_windows
            started += [(name, e) for e in range(max(1, -(-lo // n)), (hi - 1) // n + 1) if hi > lo]
        return started
