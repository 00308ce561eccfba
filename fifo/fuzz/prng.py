"""A small deterministic PRNG (splitmix64) for the fuzzer: `random` is not allowed in `fifo/`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")

_MASK = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


class SplitMix64:
    """Seeded 64-bit generator; the same seed gives the same stream in every process."""

    __slots__ = ("_state",)

    def __init__(self, seed: int) -> None:
        self._state = seed & _MASK

    def next_u64(self) -> int:
        """The next 64-bit value of the stream."""
        self._state = (self._state + _GOLDEN) & _MASK
        z = self._state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
        return z ^ (z >> 31)

    def below(self, bound: int) -> int:
        """A uniform integer in [0, bound); rejection sampling keeps it unbiased."""
        if bound <= 0:
            raise ValueError("bound must be positive")
        limit = (_MASK + 1) - ((_MASK + 1) % bound)
        while True:
            value = self.next_u64()
            if value < limit:
                return value % bound

    def between(self, low: int, high: int) -> int:
        """A uniform integer in [low, high] (both inclusive)."""
        return low + self.below(high - low + 1)

    def chance(self, numerator: int, denominator: int) -> bool:
        """True with probability numerator/denominator."""
        return self.below(denominator) < numerator

    def choice(self, items: Sequence[T]) -> T:
        """One element of a non-empty sequence."""
        return items[self.below(len(items))]

    def weighted(self, table: Sequence[tuple[int, T]]) -> T:
        """One value of a (weight, value) table, drawn by weight; weights must sum above 0."""
        total = sum(weight for weight, _ in table)
        pick = self.below(total)
        for weight, value in table:
            if pick < weight:
                return value
            pick -= weight
        raise AssertionError("unreachable: pick is below the total weight")

    def fork(self, salt: int) -> SplitMix64:
        """An independent stream derived from this one and `salt` (for sub-decisions)."""
        return SplitMix64(self.next_u64() ^ (salt * _GOLDEN & _MASK))
