"""Lane packing: several low-bit quantized levels in one 32-bit switch register.

The arithmetic is fixed by the design notes and shared by every part of the project:

* a job of ``n`` workers quantizes to ``b`` bits, symmetric levels ``-L..L`` with
  ``L = 2**(b-1) - 1``; a worker encodes level ``q`` as ``u = q + L`` (offset binary);
* b = 1 is the sign mode: levels -1 and +1, encoded as ``u`` in {0, 1} (offset 0, and
  the receiver turns the lane sum ``s`` into the level sum ``2*s - n``);
* a lane must hold the sum of ``n`` encodings: ``w = ceil(log2(n * 2L + 1))`` bits;
* one 32-bit word carries ``m = floor(32 / w)`` lanes, lane ``j`` at bits ``j*w ..``;
* the switch adds whole words with wrapping 32-bit addition; no carry crosses a lane.

b = 32 is the SwitchML-style fixed-point baseline: one value per word (``w = 32``,
``m = 1``), two's complement through the same offset-binary rule, with
``L = (2**31 - 1) // n`` so that the sum of ``n`` values cannot overflow.

``packed=False`` is the baseline that isolates packing: the same levels, one value per
register (``m = 1``), so a b-bit job takes as many registers and packet words as a
32-bit one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

WORD_BITS = 32
MAX_WORKERS = 32  # the switch's contribution bitmap is one 32-bit register
BIT_WIDTHS = tuple(range(1, 9)) + (32,)


class LaneError(ValueError):
    """A bit width / worker count that no 32-bit lane layout can serve."""


@dataclass(frozen=True)
class LaneFormat:
    """The number format of one job: bits ``b``, workers ``n`` and what follows."""

    bits: int
    workers: int
    packed: bool = True  # False: one value per 32-bit word, whatever the width

    def __post_init__(self):
        if self.bits not in BIT_WIDTHS:
            raise LaneError(f"bit width {self.bits} is not supported: use 1..8 or 32")
        if not 1 <= self.workers <= MAX_WORKERS:
            raise LaneError(f"{self.workers} workers: a job has 1..{MAX_WORKERS} workers")
        if self.width > WORD_BITS:
            raise LaneError(f"{self.workers} workers at {self.bits} bits need "
                            f"{self.width}-bit lanes, more than a 32-bit register")

    @property
    def levels(self) -> int:
        """L: the largest level magnitude (levels run -L..L)."""
        if self.bits == 1:
            return 1
        if self.bits == WORD_BITS:
            return (2**31 - 1) // self.workers
        return 2 ** (self.bits - 1) - 1

    @property
    def offset(self) -> int:
        """What a worker adds to a level to get its unsigned encoding."""
        return 0 if self.bits == 1 else self.levels

    @property
    def width(self) -> int:
        """w: bits of one lane, enough for the sum of all workers' encodings."""
        if self.bits == WORD_BITS:
            return WORD_BITS
        top = self.workers * (1 if self.bits == 1 else 2 * self.levels)
        return int(top).bit_length()  # == ceil(log2(top + 1))

    @property
    def lanes(self) -> int:
        """m: lanes per 32-bit word."""
        return WORD_BITS // self.width if self.packed else 1

    def words_for(self, elements: int) -> int:
        """32-bit words needed for ``elements`` values."""
        return -(-elements // self.lanes)

    # -- encoding ---------------------------------------------------------------------
    def encode(self, levels: np.ndarray) -> np.ndarray:
        """Levels (int, -L..L; 0/1 in sign mode) to unsigned lane values."""
        # Widen first: adding the offset in a narrow dtype (int8 levels + 127) wraps.
        wide = np.int64 if self.bits == WORD_BITS else np.int32
        return (np.asarray(levels).astype(wide, copy=False) + self.offset).astype(np.uint32)

    def pack(self, levels: np.ndarray, words: int | None = None) -> np.ndarray:
        """Pack levels into uint32 words, lane j of word k = element k*m + j.

        The tail is padded with the encoding of level 0 (or 0 in sign mode), so a
        padded lane sums to a known value and unpacks to level sum 0 (sign mode: -n).
        """
        return self.pack_lanes(self.encode(levels), words)

    def pack_lanes(self, lanes: np.ndarray, words: int | None = None) -> np.ndarray:
        """Pack already encoded lane values (uint32, ``0..2L``) like :meth:`pack`."""
        m, w = self.lanes, self.width
        u = np.asarray(lanes, dtype=np.uint32)
        words = self.words_for(len(u)) if words is None else words
        if len(u) > words * m:
            raise ValueError(f"{len(u)} values do not fit in {words} words of {m} lanes")
        if len(u) < words * m:
            padded = np.full(words * m, self.offset, dtype=np.uint32)
            padded[: len(u)] = u
            u = padded
        if m == 1:
            return u.copy() if u is lanes else u
        u = u.reshape(words, m)
        out = u[:, 0].copy()
        for j in range(1, m):
            out |= u[:, j] << np.uint32(j * w)
        return out

    def unpack_sum(self, words: np.ndarray, count: int) -> np.ndarray:
        """Aggregated words to the int64 sums of the workers' levels (first ``count``)."""
        words = np.asarray(words, dtype=np.uint32)
        m, w, n = self.lanes, self.width, self.workers
        if count > len(words) * m:
            raise ValueError(f"{len(words)} words hold fewer than {count} values")
        if self.bits == WORD_BITS:
            # The lane sum is n*L + (sum of levels), never wrapped; its difference from
            # n*L, taken modulo 2**32, is the level sum in two's complement.
            bias = np.uint32((n * self.offset) & 0xFFFFFFFF)
            return (words[:count] - bias).view(np.int32).astype(np.int64)
        mask = np.uint32((1 << w) - 1)
        lane = np.empty((len(words), m), dtype=np.int64)
        for j in range(m):
            np.bitwise_and(words >> np.uint32(j * w), mask, out=lane[:, j])
        lane = lane.reshape(-1)[:count]
        if self.bits == 1:
            lane *= 2
            lane -= n
        else:
            lane -= n * self.offset
        return lane

    def describe(self) -> str:
        return (f"b={self.bits} n={self.workers}: w={self.width} m={self.lanes}"
                + ("" if self.packed or self.bits == WORD_BITS else " (unpacked)"))
