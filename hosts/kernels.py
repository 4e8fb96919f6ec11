"""Compiled kernels of a worker's hot path: quantize and pack into a packet's payload,
unpack and dequantize an aggregate, in one pass over the elements each.

They compute exactly what the numpy reference of ``quantize.Quantizer`` and
``lanes.LaneFormat`` computes (same float arithmetic in the same order, the same
random numbers), without the intermediate arrays; ``tests/test_kernels.py`` checks
them bit for bit against it for every format. Compiled by numba on first use and
cached on disk (``warm()`` compiles or loads them ahead of a timed run).

Payload words are big-endian on the wire: the kernels take them as native
``uint32`` views of the packet bytes and swap the bytes themselves.
"""

from __future__ import annotations

import numpy as np
from numba import njit as _njit


def njit(**options):
    """numba's ``njit(cache=True, **options)``; without the on-disk cache where numba
    finds no directory it may write (a user whose home is not writable, a read-only
    checkout), which then compiles on first use in each process."""
    def compile_(fn):
        try:
            return _njit(cache=True, **options)(fn)
        except RuntimeError as exc:  # "cannot cache function ...: no locator available"
            if "no locator" not in str(exc):
                raise
            return _njit(**options)(fn)
    return compile_


_B0, _B1 = np.uint64(0xFF), np.uint64(0xFF00)
_S8, _S24 = np.uint64(8), np.uint64(24)


@njit(nogil=True, inline="always")
def _swap(word):
    """The 32-bit ``word`` with its bytes reversed (as uint64)."""
    w = np.uint64(word)
    return ((w & _B0) << _S24) | ((w & _B1) << _S8) | ((w >> _S8) & _B1) | ((w >> _S24) & _B0)


@njit(nogil=True, inline="always")
def _level(v, gain, noise, i, stochastic, centre, zero, top):
    """Offset-binary lane value of one element: ``floor(clip(v * gain + noise[i] +
    centre, 0, top))`` (as int64: ``top`` < 2**31, so truncating is flooring)."""
    y = v * gain
    if stochastic:
        y = y + noise[i]
    y = y + centre
    if y < zero:
        y = zero
    elif y > top:
        y = top
    return np.int64(y)


@njit(nogil=True)
def quantize_pack(values, gains, noise, centre, top, chunk_elems, lanes, width, offset,
                  out, levels):
    """Chunk ``r`` of ``values`` (``chunk_elems`` elements, the last may be short) into
    row ``r`` of ``out`` (native view of big-endian payload words), lane ``j`` of word
    ``k`` holding element ``k * lanes + j`` of the chunk.

    ``u = floor(clip(v * gains[r] + noise + centre, 0, top))`` (``noise`` empty:
    rounding to nearest, its 0.5 already in ``centre``); padding lanes hold ``offset``;
    ``levels``, if not empty, gets ``u - offset`` per element.
    """
    n = values.shape[0]
    keep = levels.shape[0] > 0
    stochastic = noise.shape[0] > 0
    zero = centre - centre  # 0 in the arithmetic's float type
    words = out.shape[1]
    span = words * lanes
    for r in range(out.shape[0]):
        gain = gains[r]
        base = r * chunk_elems
        real = min(chunk_elems, n - base, span)  # elements of the chunk in this row
        if real == span and not keep:  # every lane an element: no checks per element
            for k in range(words):
                word = np.uint64(0)
                i = base + k * lanes
                for j in range(lanes):
                    u = _level(values[i + j], gain, noise, i + j, stochastic, centre,
                               zero, top)
                    word |= np.uint64(u) << np.uint64(j * width)
                out[r, k] = _swap(word)
            continue
        for k in range(words):
            word = np.uint64(0)
            for j in range(lanes):
                e = k * lanes + j
                if e < real:
                    u = _level(values[base + e], gain, noise, base + e, stochastic, centre,
                               zero, top)
                    if keep:
                        levels[base + e] = u - offset
                else:
                    u = np.int64(offset)
                word |= np.uint64(u) << np.uint64(j * width)
            out[r, k] = _swap(word)


@njit(nogil=True)
def unpack_scale(words, count, lanes, width, bias, sign_workers, factors, chunk_elems,
                 out, sums, scratch):
    """The first ``count`` lane sums of ``words`` (native view of big-endian payload
    words, row after row), minus ``bias`` (sign mode, ``sign_workers`` > 0:
    ``2s - n``), times their chunk's factor, into ``out``; ``sums``, if not empty,
    gets the level sums. A 32-bit lane is a two's complement difference from ``bias``.
    ``scratch`` (one element of the factors' type) converts a sum as ``astype`` does.
    """
    keep = sums.shape[0] > 0
    mask = np.uint64((1 << width) - 1)
    per_row = words.shape[1]
    i = 0
    c = 0  # the chunk of element i, and its factor; elements left in it
    f = factors[0]
    left = chunk_elems
    for r in range(words.shape[0]):
        for k in range(per_row):
            word = np.uint64(_swap(words[r, k]))
            for j in range(lanes):
                if i >= count:
                    return
                lane = np.int64((word >> np.uint64(j * width)) & mask)
                if width == 32:
                    s = (lane - bias) & 0xFFFFFFFF
                    if s >= 0x80000000:
                        s -= 0x100000000
                elif sign_workers > 0:
                    s = 2 * lane - sign_workers
                else:
                    s = lane - bias
                if keep:
                    sums[i] = s
                scratch[0] = s
                out[i] = scratch[0] * f
                i += 1
                left -= 1
                if left == 0 and i < count:
                    c += 1
                    f = factors[c]
                    left = chunk_elems


@njit(nogil=True)
def relative_error(value, exact):
    """``||value - exact|| / max(||exact||, 1e-30)`` in one pass, summed in float64."""
    diff = 0.0
    norm = 0.0
    for i in range(value.shape[0]):
        e = np.float64(exact[i])
        d = np.float64(value[i]) - e
        diff += d * d
        norm += e * e
    return np.sqrt(diff) / max(np.sqrt(norm), 1e-30)


def warm():
    """Compile the kernels (or load them from the disk cache) for the formats a run
    uses, so that no agent compiles inside its timed loop: payloads both as rows of
    their own (C layout) and as the payload field of whole datagrams (strided, the
    agents' send buffers); the error against exact sums computed in the agent, or
    mapped read-only from the run's file of them (``traces.load_exact_sums``)."""
    from ..p4.header import QAINA_DTYPE
    in_datagrams = np.zeros(2, dtype=QAINA_DTYPE)["words"].view(np.uint32)
    for dtype in (np.float32, np.float64):
        values = np.zeros(8, dtype=np.float32)
        gains = np.ones(2, dtype=dtype)
        noise = np.zeros(8, dtype=dtype)
        levels = np.zeros(8, dtype=np.int32)
        centre, top = dtype(1.0), dtype(2.0)
        for out in (np.zeros((2, 4), dtype=np.uint32), in_datagrams):
            quantize_pack(values, gains, noise, centre, top, 4, 1, 3, 1, out, levels)
            quantize_pack(values, gains, noise[:0], centre, top, 4, 1, 3, 1, out,
                          levels[:0])
        out = np.zeros((2, 4), dtype=np.uint32)
        mapped = values.copy()
        mapped.setflags(write=False)  # another signature for numba
        relative_error(values, values)
        relative_error(values, mapped)
        for sums in (np.zeros(8, np.int64), np.zeros(0, np.int64)):
            unpack_scale(out, 8, 1, 3, 1, 0, gains, 4, np.zeros(8, np.float32), sums,
                         np.zeros(1, dtype))
