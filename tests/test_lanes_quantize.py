"""Lane packing (hosts/lanes.py) and quantization (hosts/quantize.py)."""

import numpy as np
import pytest

from qaina_bench.hosts.lanes import BIT_WIDTHS, LaneError, LaneFormat
from qaina_bench.hosts.quantize import (EXP_MIN, Quantizer, agree_exponents, chunk_count,
                                        chunk_exponents)

pytestmark = pytest.mark.smoke

WORKER_COUNTS = (1, 2, 4, 8, 16, 32)
ALL_FORMATS = [(b, n) for b in BIT_WIDTHS for n in WORKER_COUNTS]


def wrapping_sum(word_arrays):
    """What the switch does: add whole 32-bit words, modulo 2**32."""
    total = np.zeros_like(word_arrays[0], dtype=np.uint32)
    for words in word_arrays:
        total += words  # uint32 + uint32 wraps
    return total


def level_value(fmt, levels):
    """The signed level a worker's quantizer output stands for (b = 1: 2u - 1)."""
    levels = np.asarray(levels, dtype=np.int64)
    return 2 * levels - 1 if fmt.bits == 1 else levels


def random_levels(fmt, rng, count):
    if fmt.bits == 1:
        return rng.integers(0, 2, count)
    return rng.integers(-fmt.levels, fmt.levels + 1, count)


# -- LaneFormat ---------------------------------------------------------------------------

def test_design_examples():
    fmt = LaneFormat(4, 8)
    assert (fmt.levels, fmt.width, fmt.lanes) == (7, 7, 4)
    base = LaneFormat(32, 8)
    assert (base.width, base.lanes, base.levels) == (32, 1, (2**31 - 1) // 8)
    sign = LaneFormat(1, 4)
    assert (sign.levels, sign.offset, sign.width, sign.lanes) == (1, 0, 3, 10)


@pytest.mark.parametrize("bits,workers", ALL_FORMATS)
def test_lane_layout_is_consistent(bits, workers):
    fmt = LaneFormat(bits, workers)
    top = workers * (1 if bits == 1 else 2 * fmt.levels)
    assert top <= 2**fmt.width - 1  # the largest lane sum fits its lane
    if bits != 32:
        assert top > 2 ** (fmt.width - 1) - 1  # and the lane is no wider than needed
    assert fmt.lanes * fmt.width <= 32 < (fmt.lanes + 1) * fmt.width


@pytest.mark.parametrize("bits,workers", [(9, 4), (0, 4), (16, 2), (4, 0), (4, 33), (1, -1)])
def test_lane_format_rejects(bits, workers):
    with pytest.raises(LaneError):
        LaneFormat(bits, workers)


def test_lane_error_messages_name_the_problem():
    with pytest.raises(ValueError, match="bit width 9"):
        LaneFormat(9, 4)
    with pytest.raises(ValueError, match="0 workers"):
        LaneFormat(4, 0)
    with pytest.raises(ValueError, match="33 workers"):
        LaneFormat(4, 33)


@pytest.mark.parametrize("bits,workers", ALL_FORMATS)
def test_pack_round_trip(bits, workers):
    fmt = LaneFormat(bits, workers)
    rng = np.random.default_rng([bits, workers])
    count = 7 * fmt.lanes + 3  # a partial last word
    levels = [random_levels(fmt, rng, count) for _ in range(workers)]
    words = [fmt.pack(q) for q in levels]
    assert all(w.dtype == np.uint32 and len(w) == fmt.words_for(count) for w in words)
    expected = sum(level_value(fmt, q) for q in levels)
    np.testing.assert_array_equal(fmt.unpack_sum(wrapping_sum(words), count), expected)


@pytest.mark.parametrize("bits,workers", ALL_FORMATS)
def test_lane_sums_at_the_boundaries_do_not_carry(bits, workers):
    fmt = LaneFormat(bits, workers)
    count = 3 * fmt.lanes
    top = 1 if bits == 1 else fmt.levels
    bottom = 0 if bits == 1 else -fmt.levels
    n_top = workers if bits == 1 else workers * fmt.levels
    for level, expected in ((top, n_top), (bottom, -n_top)):
        words = [fmt.pack(np.full(count, level)) for _ in range(workers)]
        np.testing.assert_array_equal(fmt.unpack_sum(wrapping_sum(words), count),
                                      np.full(count, expected))
    # neighbouring lanes at opposite extremes: a carry out of a full lane would show
    alternating = np.where(np.arange(count) % 2 == 0, top, bottom)
    words = [fmt.pack(alternating) for _ in range(workers)]
    np.testing.assert_array_equal(fmt.unpack_sum(wrapping_sum(words), count),
                                  np.where(np.arange(count) % 2 == 0, n_top, -n_top))


def test_full_lanes_fill_exactly_their_bits():
    fmt = LaneFormat(4, 8)  # w = 7, m = 4: lane sums up to 112 of 127
    words = wrapping_sum([fmt.pack(np.full(4, 7)) for _ in range(8)])
    assert words.tolist() == [sum(112 << (7 * j) for j in range(4))]


def test_pack_pads_the_tail_with_level_zero():
    fmt = LaneFormat(4, 2)
    words = wrapping_sum([fmt.pack([3]), fmt.pack([-1])])
    assert fmt.unpack_sum(words, fmt.lanes).tolist() == [2] + [0] * (fmt.lanes - 1)


def test_pack_accepts_narrow_integer_levels():
    fmt = LaneFormat(8, 2)
    q = np.array([127, -127, 0, 5], dtype=np.int8)
    words = wrapping_sum([fmt.pack(q), fmt.pack(q)])
    assert fmt.unpack_sum(words, 4).tolist() == [254, -254, 0, 10]


def test_pack_rejects_too_few_words():
    fmt = LaneFormat(4, 4)
    with pytest.raises(ValueError):
        fmt.pack(np.zeros(3 * fmt.lanes + 1, dtype=np.int32), words=3)


# -- chunk exponents ----------------------------------------------------------------------

def reference_exponents(grad, chunk_elems):
    out = []
    for start in range(0, len(grad), chunk_elems):
        peak = float(np.max(np.abs(grad[start:start + chunk_elems].astype(np.float64))))
        e = EXP_MIN
        while e < 127 and 2.0**e < peak:
            e += 1
        out.append(e)
    return np.array(out)


def test_chunk_exponents_are_the_smallest_bounding_powers():
    rng = np.random.default_rng(1)
    grad = (rng.standard_normal(1000) * 10.0 ** rng.integers(-30, 10, 1000)).astype(np.float32)
    grad[:8] = [0.25, -0.5, 0, 0, 0, 0, 0, 0]            # exact power of two: e = -1
    grad[8:16] = [0.25, np.nextafter(np.float32(0.5), np.float32(1)), 0, 0, 0, 0, 0, 0]
    grad[16:24] = 0.0                                     # all zero
    grad[24:32] = -3.0                                    # negative peak: e = 2
    grad[32:40] = 1e-40                                   # subnormal float32
    e = chunk_exponents(grad, 8)
    assert e.dtype == np.int8 and len(e) == chunk_count(1000, 8)
    assert e[:5].tolist() == [-1, 0, EXP_MIN, 2, EXP_MIN]
    np.testing.assert_array_equal(e, reference_exponents(grad, 8))
    assert np.all(np.abs(grad) <= np.ldexp(1.0, np.repeat(e, 8)[:1000]))


def test_chunk_exponents_short_last_chunk():
    grad = np.array([1, 1, 1, 1, 1.5, 3], dtype=np.float32)
    assert chunk_exponents(grad, 4).tolist() == [0, 2]
    assert chunk_exponents(np.zeros(0, np.float32), 4).tolist() == []


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf, 3e38])
def test_chunk_exponents_reject_unusable_values(bad):
    grad = np.zeros(16, dtype=np.float32)
    grad[9] = bad
    with pytest.raises(ValueError):
        chunk_exponents(grad, 8)


def test_agree_exponents_takes_the_maximum():
    a = np.array([-3, 5, EXP_MIN], dtype=np.int8)
    b = np.array([-1, 2, -50], dtype=np.int8)
    assert agree_exponents(a, b).tolist() == [-1, 5, -50]


# -- quantizer ----------------------------------------------------------------------------

def test_quantize_level_ranges():
    rng = np.random.default_rng(2)
    grad = rng.standard_normal(4096).astype(np.float32)
    peaks = 2.0 ** rng.integers(-3, 3, len(grad[::100]))
    grad[::100] = np.where(np.arange(len(peaks)) % 2, peaks, -peaks)  # exact +-2**e
    for bits in (1, 2, 4, 8, 32):
        fmt = LaneFormat(bits, 4)
        chunk = 16 * fmt.lanes
        q = Quantizer(fmt, rng).quantize(grad, chunk_exponents(grad, chunk), chunk)
        assert q.dtype == np.int32 and len(q) == len(grad)
        low, high = (0, 1) if bits == 1 else (-fmt.levels, fmt.levels)
        assert q.min() == low and q.max() == high  # the extremes 2**e are reached


def test_exponents_too_small_saturate_instead_of_spilling():
    fmt = LaneFormat(4, 2)
    grad = np.full(fmt.lanes * 4, 100.0, dtype=np.float32)
    grad[::2] = -100.0
    exps = np.zeros(1, dtype=np.int8)  # claims |g| <= 1
    q = Quantizer(fmt, np.random.default_rng(3))
    levels = q.quantize(grad, exps, len(grad))
    assert set(levels.tolist()) == {-fmt.levels, fmt.levels}
    words = wrapping_sum([q.encode(grad, exps, len(grad))] * 2)
    np.testing.assert_array_equal(fmt.unpack_sum(words, len(grad)), 2 * levels)


def unbiasedness_input(fmt):
    """Two chunks of 8*m values covering [-2**e, 2**e], edges and zero included."""
    chunk = 8 * fmt.lanes
    rng = np.random.default_rng(4)
    grad = np.concatenate([rng.uniform(-0.75, 0.75, chunk), rng.uniform(-8.0, 8.0, chunk)])
    grad[[0, 1, 2, chunk, chunk + 1]] = [0.0, -0.75, 0.75, 8.0, -8.0]
    grad = grad.astype(np.float32)
    exps = chunk_exponents(grad, chunk)
    assert exps.tolist() == [0, 3]
    return grad, exps, chunk


@pytest.mark.parametrize("bits", [1, 2, 4, 8])
def test_quantization_is_unbiased(bits):
    fmt = LaneFormat(bits, 1)
    grad, exps, chunk = unbiasedness_input(fmt)
    reps = 4000  # independent quantizations of every element, made in one call
    tiled, tiled_exps = np.tile(grad, reps), np.tile(exps, reps)
    q = Quantizer(fmt, np.random.default_rng(5))
    decoded = q.decode(q.encode(tiled, tiled_exps, chunk), tiled_exps, len(tiled), chunk)
    mean = decoded.reshape(reps, -1).astype(np.float64).mean(axis=0)
    # per-element standard deviation bound of one quantization: a level step times 1/2
    step = np.repeat(np.ldexp(1.0, exps.astype(int)), chunk) / (1 if bits == 1 else fmt.levels)
    if bits == 1:
        step = 2 * step  # the two outcomes are 2 * 2**e apart
    sigma = step / 2 / np.sqrt(reps)
    assert np.all(np.abs(mean - grad) <= 5 * sigma)
    # and much sharper in aggregate: the average error over all elements
    assert abs(np.mean((mean - grad) / sigma)) < 5 / np.sqrt(len(grad))


def test_nearest_rounding_takes_the_nearest_level():
    fmt = LaneFormat(2, 1)  # levels -1, 0, 1
    grad = np.full(8 * fmt.lanes, 0.3, dtype=np.float32)
    exps = np.zeros(1, dtype=np.int8)
    q = Quantizer(fmt, stochastic=False)
    decoded = q.decode(q.encode(grad, exps, len(grad)), exps, len(grad), len(grad))
    np.testing.assert_array_equal(decoded, 0.0)


@pytest.mark.parametrize("bits", [2, 3, 4, 5, 6, 7, 8, 32])
@pytest.mark.parametrize("stochastic", [True, False])
def test_error_bound(bits, stochastic):
    fmt = LaneFormat(bits, 1)
    chunk = 32 * fmt.lanes
    rng = np.random.default_rng(6)
    scales = 10.0 ** rng.uniform(-12, 3, 40)
    grad = (rng.standard_normal((40, chunk)) * scales[:, None]).astype(np.float32).reshape(-1)
    grad = grad[: len(grad) - 5]  # a short last chunk
    exps = chunk_exponents(grad, chunk)
    q = Quantizer(fmt, rng, stochastic=stochastic)
    decoded = q.decode(q.encode(grad, exps, chunk), exps, len(grad), chunk)
    assert decoded.dtype == np.float32
    bound = np.repeat(np.ldexp(1.0, exps.astype(int)), chunk)[: len(grad)] / fmt.levels
    if not stochastic:
        bound = bound / 2
    bound = bound * (1 + 1e-6) + np.spacing(np.abs(grad))  # float32 result rounding
    assert np.all(np.abs(decoded.astype(np.float64) - grad) <= bound)


@pytest.mark.parametrize("bits", [1, 4, 8, 32])
def test_workers_sum_through_the_switch(bits):
    workers = 4
    fmt = LaneFormat(bits, workers)
    chunk = 32 * fmt.lanes
    rng = np.random.default_rng(7)
    grads = [(rng.standard_normal(10 * chunk + 17) * 1e-3).astype(np.float32)
             for _ in range(workers)]
    exps = agree_exponents(*[chunk_exponents(g, chunk) for g in grads])
    quantizers = [Quantizer(fmt, np.random.default_rng(k)) for k in range(workers)]
    words = [qz.encode(g, exps, chunk) for qz, g in zip(quantizers, grads)]
    assert all(len(w) == fmt.words_for(len(grads[0])) for w in words)
    total = quantizers[0].decode(wrapping_sum(words), exps, len(grads[0]), chunk)
    exact = np.sum(grads, axis=0, dtype=np.float64)
    step = np.repeat(np.ldexp(1.0, exps.astype(int)), chunk)[: len(exact)]
    step = step * (2 if bits == 1 else 1.0 / fmt.levels)
    rounding = np.spacing(np.abs(exact).astype(np.float32))  # of the float32 result
    assert np.all(np.abs(total - exact) <= workers * step * (1 + 1e-6) + rounding)
    if bits == 32:
        assert np.max(np.abs(total - exact)) < 1e-9


def test_chunks_occupy_contiguous_words():
    fmt = LaneFormat(4, 4)
    chunk = 32 * fmt.lanes
    q = Quantizer(fmt, stochastic=False)
    assert q.chunk_words(chunk) == 32
    grad = np.random.default_rng(8).standard_normal(5 * chunk + 11).astype(np.float32)
    exps = chunk_exponents(grad, chunk)
    words = q.encode(grad, exps, chunk)
    for c in range(len(exps)):
        alone = q.encode(grad[c * chunk:(c + 1) * chunk], exps[c:c + 1], chunk)
        np.testing.assert_array_equal(words[c * 32:c * 32 + len(alone)], alone)


def test_encode_checks_its_arguments():
    fmt = LaneFormat(4, 4)  # m = 5
    q = Quantizer(fmt, np.random.default_rng(9))
    grad = np.ones(320, dtype=np.float32)
    with pytest.raises(ValueError, match="multiple"):
        q.encode(grad, np.zeros(2, np.int8), 32 * 4 + 1)
    with pytest.raises(ValueError, match="exponents"):
        q.encode(grad, np.zeros(3, np.int8), 160)
    with pytest.raises(TypeError):
        q.encode(grad, np.zeros(2, np.float32), 160)
    with pytest.raises(ValueError, match="words"):
        q.decode(np.zeros(10, np.uint32), np.zeros(2, np.int8), 320, 160)


def test_quantizer_reuses_its_buffers_safely():
    fmt = LaneFormat(4, 1)
    q = Quantizer(fmt, np.random.default_rng(10), stochastic=False)
    big = np.linspace(-1, 1, 50 * fmt.lanes, dtype=np.float32)
    small = np.linspace(-1, 1, 10 * fmt.lanes, dtype=np.float32)
    first = q.quantize(big, chunk_exponents(big, len(big)), len(big))
    second = q.quantize(small, chunk_exponents(small, len(small)), len(small))
    assert first[0] == -7 and first[-1] == 7 and len(second) == len(small)
    np.testing.assert_array_equal(first, q.quantize(big, chunk_exponents(big, len(big)),
                                                    len(big)))
