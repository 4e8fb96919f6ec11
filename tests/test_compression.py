"""The quantizers by name, error feedback, b = 1 signs and adaptive headroom
(hosts/quantize.py, hosts/compression.py): unbiased where they claim it, exact
integer sums, no lane overflow at the extremes, residuals that add up."""

from __future__ import annotations

import numpy as np
import pytest

from qaina_bench.hosts.compression import QUANTIZERS, CodecConfig, WorkerCodec
from qaina_bench.hosts.lanes import BIT_WIDTHS
from qaina_bench.hosts.quantize import MAXFINE, MAXPOW2, chunk_exponents, scale_rule
from qaina_bench.p4.header import QAINA_WORDS

pytestmark = pytest.mark.smoke


def codecs(bits, workers, quantizer="maxpow2", error_feedback=False, seed=0):
    cfg = CodecConfig(bits, workers, quantizer, 256, error_feedback)
    return [WorkerCodec(cfg, np.random.default_rng([seed, k]), QAINA_WORDS)
            for k in range(workers)]


def aggregate(cs, vectors):
    """What the switch and the agents do, without the network: every worker's codes,
    the maximum over the workers, levels, their integer sum, the dequantized sum."""
    values = [c.values(v) for c, v in zip(cs, vectors)]
    agreed = np.maximum.reduce([c.codes(v) for c, v in zip(cs, values)])
    levels = [c.quantize(v, agreed) for c, v in zip(cs, values)]
    fmt = cs[0].fmt
    total = sum((2 * lv - 1 if fmt.bits == 1 else lv).astype(np.int64) for lv in levels)
    for c, v, lv in zip(cs, values, levels):
        c.book(v, lv, agreed)
    return cs[0].dequantize_sum(total, agreed), levels, agreed


def test_maxpow2_codes_are_the_chunk_exponents_and_maxfine_is_finer():
    rng = np.random.default_rng(1)
    g = (rng.standard_normal(1000) * 10.0 ** rng.integers(-6, 3, 1000)).astype(np.float32)
    assert np.array_equal(MAXPOW2.codes(g, 40), chunk_exponents(g, 40))
    stat = MAXFINE.statistics(g, 40)
    scale = MAXFINE.factors(MAXFINE.codes(g, 40))
    assert (scale >= stat).all() and (scale < stat * 2 ** 0.25 * (1 + 1e-9)).all()
    coarse = MAXPOW2.factors(MAXPOW2.codes(g, 40))
    assert (scale <= coarse).all() and (scale < coarse).any()


def test_qsgd_scale_is_the_shared_bucket_norm():
    rule = scale_rule("qsgd", 160, bucket=480)
    assert rule.bucket_chunks == 3
    g = np.random.default_rng(2).standard_normal(1000).astype(np.float32)
    stat = rule.statistics(g, 160)
    norms = [np.linalg.norm(g[i:i + 480].astype(np.float64)) for i in range(0, 1000, 480)]
    assert np.allclose(stat, np.repeat(norms, 3)[:7])
    assert (rule.factors(rule.codes(g, 160)) >= stat).all()
    # A bucket past the gradient's end is one bucket (the old code allocated the
    # whole bucket, MemoryError from an agent mid-run for --bucket 10**13).
    huge = scale_rule("qsgd", 160, bucket=10 ** 15)
    whole = np.linalg.norm(g.astype(np.float64))
    assert np.allclose(huge.statistics(g, 160), whole)
    assert np.allclose(scale_rule("qsgd", 1, bucket=10 ** 15).statistics(g, 1), whole)


@pytest.mark.parametrize("quantizer", QUANTIZERS)
@pytest.mark.parametrize("bits", [2, 4, 8])
def test_each_quantizer_is_unbiased(quantizer, bits):
    """The mean of many aggregates of the same gradients is their exact sum."""
    rng = np.random.default_rng(bits)
    vectors = [rng.standard_normal(640).astype(np.float32) for _ in range(4)]
    exact = np.sum(vectors, axis=0)
    cs = codecs(bits, 4, quantizer, seed=bits)
    trials = 400
    mean = sum(aggregate(cs, vectors)[0].astype(np.float64) for _ in range(trials)) / trials
    single = aggregate(cs, vectors)[0] - exact
    # the bias left is far below one aggregate's error
    assert np.linalg.norm(mean - exact) < 3 * np.linalg.norm(single) / np.sqrt(trials)


@pytest.mark.parametrize("quantizer", QUANTIZERS)
@pytest.mark.parametrize("bits", [b for b in BIT_WIDTHS if b > 1])
def test_levels_stay_in_their_lanes_at_the_extremes(quantizer, bits):
    """Every worker at the top of its range, or at the bottom: the integer lane sums
    never carry, for every quantizer."""
    cs = codecs(bits, 8, quantizer)
    fmt = cs[0].fmt
    for sign in (1.0, -1.0):
        v = np.full(fmt.lanes * QAINA_WORDS * 3, sign, dtype=np.float32)
        v[::7] = sign * 0.5
        _, levels, agreed = aggregate(cs, [v] * 8)
        for lv in levels:
            assert np.abs(lv).max() <= fmt.levels
        words = [fmt.pack(lv) for lv in levels]
        total = np.zeros_like(words[0])
        for w in words:
            total += w
        assert np.array_equal(fmt.unpack_sum(total, len(v)), np.sum(levels, axis=0))


@pytest.mark.parametrize("bits", [2, 4])
def test_error_feedback_carries_what_quantization_dropped(bits):
    """Over many iterations the sum of the aggregates approaches the sum of the
    gradients: what one iteration drops, a later one sends."""
    rng = np.random.default_rng(7)
    iterations = 40
    grads = [[rng.standard_normal(640).astype(np.float32) * 0.01 for _ in range(4)]
             for _ in range(iterations)]
    exact = np.sum([np.sum(g, axis=0) for g in grads], axis=0)
    errors = {}
    for ef in (False, True):
        cs = codecs(bits, 4, error_feedback=ef, seed=3)
        total = sum(aggregate(cs, g)[0].astype(np.float64) for g in grads)
        errors[ef] = np.linalg.norm(total - exact) / np.linalg.norm(exact)
        if ef:  # exactly: sum of aggregates + residuals = sum of gradients
            left = sum(c.residual.astype(np.float64) for c in cs)
            assert np.allclose(total + left, exact, atol=1e-4)
    assert errors[True] < 0.5 * errors[False]


def test_signs_with_error_feedback_track_the_gradient():
    """b = 1 sends scaled signs of gradient plus residual; over iterations the
    cumulative aggregate follows the cumulative gradient."""
    cs = codecs(1, 4)
    assert cs[0].error_feedback and cs[0].rule.name == "signmean"
    rng = np.random.default_rng(11)
    base = rng.standard_normal(640).astype(np.float32)
    total, exact = np.zeros(640), np.zeros(640)
    for _ in range(60):
        grads = [base + 0.3 * rng.standard_normal(640).astype(np.float32) for _ in range(4)]
        exact += np.sum(grads, axis=0)
        total += aggregate(cs, grads)[0]
    assert np.linalg.norm(total - exact) / np.linalg.norm(exact) < 0.2


def test_headroom_follows_the_share_of_short_predictions():
    (c4,) = codecs(4, 1)
    (c8,) = codecs(8, 1)
    assert (c4.headroom, c8.headroom) == (0, 1)  # start: none at b <= 4, an octave above
    agreed = np.array([3, 5, 4, 4], dtype=np.int8)
    assert c4.predict(agreed, 5, short=0).tolist() == [3, 5, 4, 4]
    c4.predict(agreed, 5, short=3)  # 3 of 4 fell short: more than half
    assert c4.headroom == 1
    c4.predict(agreed, 5, short=2)  # half: stays
    assert c4.headroom == 1
    c4.predict(agreed, 5, short=0)  # well below: a step down
    assert c4.headroom == 0
    c8.predict(agreed, 5, short=1)  # b = 8 allows a tenth
    assert c8.headroom == 2
    zero = np.array([c4.rule.code_min], dtype=np.int8)  # an all-zero chunk: the largest
    assert c4.predict(zero, 5, 0).tolist() == [5 + c4.headroom]
    (sign,) = codecs(1, 1)
    assert sign.headroom == 0 and not sign.adaptive


def test_workers_training_from_the_same_aggregates_keep_the_same_model():
    from qaina_bench.hosts.sources import LiveTraining
    workers = [LiveTraining(k, 4, 5, "mlp", 0, 0.3, 16, (16,), 24, 5) for k in range(4)]
    for i in range(5):
        grads = [w.gradient(i) for w in workers]
        total = np.sum(grads, axis=0)
        records = [w.apply(i, total) for w in workers]
    params = [w.job.params for w in workers]
    assert all(np.array_equal(p, params[0]) for p in params)
    assert "test_accuracy" in records[0] and "test_accuracy" not in records[1]
