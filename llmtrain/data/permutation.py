"""A seeded bijection on [0, n) in O(1) memory: a 4-round Feistel network over the smallest even number of bits
that covers n, with cycle walking (a value that lands outside [0, n) is permuted again until it is inside).

A source of 10**9 windows gets its per-epoch order without a 10**9-entry permutation in memory; the cost is a few
integer mixes per lookup (at most 4 walks on average: the Feistel domain is under 4n)."""

from __future__ import annotations

from .seeding import stable_digest

ROUNDS = 4
_MASK64 = (1 << 64) - 1


def _mix(x: int) -> int:
    """splitmix64's finaliser: a cheap, well-spread 64-bit hash."""
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9 & _MASK64
    x = (x ^ (x >> 27)) * 0x94D049BB133111EB & _MASK64
    return x ^ (x >> 31)


class FeistelPermutation:
    """`permutation(i)` for i in [0, n): every value in [0, n) exactly once, in an order fixed by `key_parts`."""

    def __init__(self, n: int, *key_parts: object):
        if n < 1:
            raise ValueError(f"a permutation needs n >= 1, got {n}")
        self.n = int(n)
        bits = max(2, (self.n - 1).bit_length())
        self.half_bits = (bits + 1) // 2
        self.half_mask = (1 << self.half_bits) - 1
        digest = stable_digest("feistel", *key_parts, size=8 * ROUNDS)
        self.round_keys = [int.from_bytes(digest[8 * r: 8 * r + 8], "little") for r in range(ROUNDS)]

    def _encrypt(self, x: int) -> int:
        left, right = x >> self.half_bits, x & self.half_mask
        for key in self.round_keys:
            left, right = right, left ^ (_mix(right ^ key) & self.half_mask)
        return (left << self.half_bits) | right

    def _decrypt(self, x: int) -> int:
        left, right = x >> self.half_bits, x & self.half_mask
        for key in reversed(self.round_keys):
            left, right = right ^ (_mix(left ^ key) & self.half_mask), left
        return (left << self.half_bits) | right

    def __call__(self, index: int) -> int:
        if not 0 <= index < self.n:
            raise IndexError(f"permutation index {index} out of range [0, {self.n})")
        x = self._encrypt(index)
        while x >= self.n:  # cycle walking: stays a bijection on [0, n)
            x = self._encrypt(x)
        return x

    def inverse(self, value: int) -> int:
        """The index that `value` sits at (which position of an epoch reads a given window)."""
        if not 0 <= value < self.n:
            raise IndexError(f"permutation value {value} out of range [0, {self.n})")
        x = self._decrypt(value)
        while x >= self.n:
            x = self._decrypt(x)
        return x
