"""The random draws of one Pathfinder image, at a fraction of what a call into ``numpy.random.Generator``
costs. The generator makes thousands of scalar draws per image, and numpy spends ~4 µs on each
``integers`` call and ~1 µs on each ``random`` call in its Python-facing layer; this stream gives the
same numbers as ``np.random.default_rng(seed)`` would, in the same order, from the same PCG64 bits
read in blocks: ``random`` is numpy's ``next_double`` ((64-bit draw >> 11) · 2⁻⁵³), ``integers`` its
bounded draw for a range below 2³², Lemire's multiply-and-reject on 32-bit draws, which PCG64 cuts
from a 64-bit draw, low half first, keeping the high half for the next 32-bit draw. The stream is
checked draw for draw against numpy's own in the tests."""

from __future__ import annotations

import numpy as np

_BLOCK = 64  # 64-bit draws fetched at a time
_UINT32 = 0xFFFFFFFF
_TO_UNIT = 1.0 / 9007199254740992.0  # 2⁻⁵³


class SeededStream:
    """``np.random.default_rng(seed)``'s ``random()`` and ``integers(low, high)`` (scalars, ranges below 2³²)."""

    def __init__(self, seed):
        self._bits = np.random.default_rng(seed).bit_generator
        self._pending: list = []  # 64-bit draws fetched and not yet used, the next one last
        self._high_half = None  # the upper 32 bits of a 64-bit draw whose lower half was used

    def _next64(self) -> int:
        if not self._pending:
            self._pending = self._bits.random_raw(_BLOCK).tolist()[::-1]
        return self._pending.pop()

    def _next32(self) -> int:
        if self._high_half is not None:
            half, self._high_half = self._high_half, None
            return half
        draw = self._next64()
        self._high_half = draw >> 32
        return draw & _UINT32

    def random(self) -> float:
        """A float in [0, 1)."""
        return (self._next64() >> 11) * _TO_UNIT

    def integers(self, low: int, high=None) -> int:
        """An int in [low, high) (or [0, low) with one argument)."""
        if high is None:
            low, high = 0, low
        span = high - low - 1
        if span == 0:
            return low  # numpy draws nothing for a single value
        if not 0 < span < _UINT32:
            raise ValueError(f"integers({low}, {high}): the range must hold 1 to 2**32 - 1 values")
        values = span + 1
        scaled = self._next32() * values
        leftover = scaled & _UINT32
        if leftover < values:
            threshold = (_UINT32 - span) % values
            while leftover < threshold:
                scaled = self._next32() * values
                leftover = scaled & _UINT32
        return low + (scaled >> 32)
