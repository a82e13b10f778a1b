"""Which source each global sample of a data=mix run draws from, and the how-many-th sample of that source it is:
pure integer arithmetic on (the mixture's history, the sample index), no torch and no precomputed arrays.

Why a pure function: every DP/TP/PP layout and micro-batch split asks for the samples it needs by global index
(sampling.batch_indices), and a resume under another layout or global batch size continues at `samples_seen`; both
see the same samples only if the answer depends on nothing else.

One segment of constant weights w_s (normalised; cumulative sums W_s kept as integers over 2**40):
- after m samples source s has had c_s(m) = floor(m*W_s) - floor(m*W_{s-1}) of them (over all s exactly m, and
  |c_s(m) - m*w_s| < 1);
- samples come in blocks of B (1024, doubled until B*w_s >= 2 for every drawn source, so each block's quota
  q_s = c_s((b+1)B) - c_s(bB) is >= 0); inside a block a source's k-th sample sits at key (k + 0.5) / q_s, ties
  by source order: a smooth interleave, so any 1,000 consecutive samples hold each source close to its weight;
- the position of a sample within its source is c_s(bB) + its rank among the block's samples of s.

The history is a list of segments {start, weights {name: w}, offsets {name: samples consumed before start}}: a
resume with other weights starts a new segment at samples_seen, so nothing already drawn is drawn again, a new
source starts at 0 and a dropped one stops (its count stays in `offsets`).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

from .errors import DataError

SCALE_BITS = 40
SCALE = 1 << SCALE_BITS
BASE_BLOCK = 1024
MAX_BLOCK = 1 << 20  # a drawn weight below 2 / MAX_BLOCK (about 2e-6) is refused


def normalised(weights: dict[str, float]) -> dict[str, float]:
    """Weights over their sum, in the same order; DataError (data.sources) for negative, non-finite or all zero."""
    for name, w in weights.items():
        if not isinstance(w, (int, float)) or not math.isfinite(w) or w < 0:
            raise DataError("data.sources", f"source {name!r} has weight {w!r}; weights must be finite and >= 0")
    total = math.fsum(weights.values())
    if total <= 0:
        raise DataError("data.sources", "the weights sum to 0; give at least one source a weight > 0")
    return {name: float(w) / total for name, w in weights.items()}


class SegmentDraws:
    """The draws of one segment of constant weights (see the module docstring); caches the current block."""

    def __init__(self, weights: list[float]):
        running, self.bounds = 0.0, [0]
        for w in weights:
            running += w
            self.bounds.append(min(SCALE, round(running * SCALE)))
        self.bounds[-1] = SCALE  # exact: the counts of all sources sum to m
        shares = [hi - lo for lo, hi in zip(self.bounds, self.bounds[1:])]
        smallest = min((q for q in shares if q > 0), default=SCALE)
        self.block = BASE_BLOCK
        while self.block * smallest < 2 * SCALE:
            self.block *= 2
        if self.block > MAX_BLOCK:
            raise DataError("data.sources", f"a weight of {smallest / SCALE:.3g} (normalised) is too small to draw; "
                                            f"give it at least {2 / MAX_BLOCK:.1g} or 0")
        self._cached: tuple[int, list[int], list[int]] | None = None

    def count(self, s: int, m: int) -> int:
        """c_s(m): samples of source s among the segment's first m."""
        return (m * self.bounds[s + 1] >> SCALE_BITS) - (m * self.bounds[s] >> SCALE_BITS)

    def _block(self, b: int) -> tuple[list[int], list[int]]:
        """(source, rank within the block's samples of that source) of each of block b's B slots."""
        if self._cached is None or self._cached[0] != b:
            start, end = b * self.block, (b + 1) * self.block
            keyed = []
            for s in range(len(self.bounds) - 1):
                quota = self.count(s, end) - self.count(s, start)
                # (2k+1)/(2q) is a correctly rounded float: equal fractions compare equal, others do not.
                keyed += [((2 * k + 1) / (2 * quota), s, k) for k in range(quota)]
            keyed.sort()
            self._cached = (b, [s for _, s, _ in keyed], [k for _, _, k in keyed])
        return self._cached[1], self._cached[2]

    def draw(self, m: int) -> tuple[int, int]:
        """(source, position within the segment's samples of that source) of the segment's sample m."""
        b, slot = divmod(m, self.block)
        sources, ranks = self._block(b)
        s = sources[slot]
        return s, self.count(s, b * self.block) + ranks[slot]

    def counts(self, m: int) -> list[int]:
        """Samples of each source among the segment's first m."""
        b, slot = divmod(m, self.block)
        out = [self.count(s, b * self.block) for s in range(len(self.bounds) - 1)]
        if slot:
            for s in self._block(b)[0][:slot]:
                out[s] += 1
        return out


@dataclass
class Segment:
    start: int  # the global sample index it begins at
    weights: dict[str, float]  # normalised, in draw order (weight 0: not drawn)
    offsets: dict[str, int]  # samples of each source (every one seen so far) consumed before `start`

    def to_json(self) -> dict:
        return {"start": self.start, "weights": dict(self.weights), "offsets": dict(self.offsets)}

    @classmethod
    def from_json(cls, raw: dict) -> "Segment":
        return cls(int(raw["start"]), {str(k): float(v) for k, v in raw["weights"].items()},
                   {str(k): int(v) for k, v in raw["offsets"].items()})


class MixtureSchedule:
    """The whole history of a mixture: global sample n -> (source name, position within that source)."""

    def __init__(self, segments: list[Segment]):
        if not segments or segments[0].start != 0:
            raise ValueError("a mixture history starts with a segment at sample 0")
        self.segments = segments
        self._starts = [seg.start for seg in segments]
        self._draws = [SegmentDraws(list(seg.weights.values())) for seg in segments]

    @classmethod
    def fresh(cls, weights: dict[str, float]) -> "MixtureSchedule":
        weights = normalised(weights)
        return cls([Segment(0, weights, {name: 0 for name in weights})])

    def continued(self, weights: dict[str, float], samples_seen: int) -> tuple["MixtureSchedule", bool]:
        """This history resumed at `samples_seen` with `weights` (by name): itself when they are the weights it
        ends with (bit-exact continuation), else with a new segment from samples_seen; and whether it changed."""
        weights = normalised(weights)
        last = self.segments[-1]
        if weights == last.weights:
            return self, False
        if samples_seen < last.start:
            raise ValueError(f"cannot resume at sample {samples_seen}: the mixture's last segment starts at "
                             f"{last.start}")
        kept = [seg for seg in self.segments if seg.start < samples_seen]
        consumed = self.consumed(samples_seen)
        offsets = {**consumed, **{name: consumed.get(name, 0) for name in weights}}
        return MixtureSchedule([*kept, Segment(samples_seen, weights, offsets)]), True

    def _segment(self, n: int) -> int:
        if n < 0:
            raise IndexError(f"sample index must be >= 0, got {n}")
        return bisect.bisect_right(self._starts, n) - 1

    def draw(self, n: int) -> tuple[str, int]:
        """(source name, how many samples of that source the run drew before this one) of global sample n."""
        i = self._segment(n)
        seg = self.segments[i]
        s, position = self._draws[i].draw(n - seg.start)
        name = list(seg.weights)[s]
        return name, seg.offsets.get(name, 0) + position

    def consumed(self, n: int) -> dict[str, int]:
        """Samples of each source (every one in the history) among global samples [0, n)."""
        if n == 0:
            return {name: 0 for name in self.segments[0].weights}
        i = self._segment(n - 1)
        seg = self.segments[i]
        out = dict(seg.offsets)
        for name, count in zip(seg.weights, self._draws[i].counts(n - seg.start)):
            out[name] = out.get(name, 0) + count
        return out

    def to_json(self) -> list[dict]:
        return [seg.to_json() for seg in self.segments]

    @classmethod
    def from_json(cls, raw: list[dict]) -> "MixtureSchedule":
        return cls([Segment.from_json(r) for r in raw])
