"""GradiVeQ slice compression (hosts/gradiveq.py), on random data and real traces."""

import numpy as np
import pytest

from qaina_bench.hosts.gradiveq import GradiVeQ, GradiVeQSchedule, LayeredGradiVeQ
from qaina_bench.hosts.lanes import LaneFormat
from qaina_bench.hosts.quantize import Quantizer, agree_exponents, chunk_exponents
from qaina_bench.hosts.traces import open_trace


@pytest.fixture(scope="module")
def trace():
    return open_trace("digits-mlp")


def fitted_on_trace(trace, k, d=64, iterations=(0, 1, 2)):
    grads = [trace.gradient(w, i) for i in iterations for w in range(trace.workers)]
    return GradiVeQ(d, k).fit_gradients(grads)


def test_basis_is_orthonormal_and_sized():
    rng = np.random.default_rng(0)
    gvq = GradiVeQ(d=16, k=5).fit(rng.standard_normal((200, 16)))
    assert gvq.basis.shape == (16, 5) and gvq.basis.dtype == np.float32
    np.testing.assert_allclose(gvq.basis.T.astype(np.float64) @ gvq.basis, np.eye(5),
                               atol=1e-6)
    assert gvq.compression_ratio == 16 / 5
    assert gvq.compressed_size(33) == 3 * 5  # 33 elements: 3 slices, the last padded
    coeffs = gvq.compress(rng.standard_normal(33))
    assert coeffs.shape == (15,) and coeffs.dtype == np.float32
    assert gvq.decompress(coeffs, 33).shape == (33,)
    assert gvq.decompress(coeffs).shape == (48,)


def test_compression_is_linear():
    rng = np.random.default_rng(1)
    gvq = GradiVeQ(d=32, k=6).fit(rng.standard_normal((500, 32)))
    a = rng.standard_normal(1000).astype(np.float32)
    b = (rng.standard_normal(1000) * 3).astype(np.float32)
    scale = np.linalg.norm(gvq.compress(a)) + np.linalg.norm(gvq.compress(b))
    np.testing.assert_allclose(gvq.compress(a) + gvq.compress(b), gvq.compress(a + b),
                               atol=1e-6 * scale)
    np.testing.assert_allclose(gvq.compress(2.5 * a), 2.5 * gvq.compress(a),
                               atol=1e-6 * scale)
    ca, cb = gvq.compress(a), gvq.compress(b)
    np.testing.assert_allclose(gvq.decompress(ca + cb, 1000),
                               gvq.decompress(ca, 1000) + gvq.decompress(cb, 1000),
                               atol=1e-6 * scale)


def test_sum_of_compressed_worker_gradients_is_the_compressed_sum(trace):
    gvq = fitted_on_trace(trace, k=8)
    i = trace.iterations - 1
    summed = np.sum([gvq.compress(trace.gradient(w, i)) for w in range(trace.workers)],
                    axis=0, dtype=np.float64)
    direct = gvq.compress(trace.exact_sum(i).astype(np.float32))
    np.testing.assert_allclose(summed, direct, atol=1e-5 * np.abs(direct).max())


def test_a_full_basis_reconstructs_exactly(trace):
    gvq = fitted_on_trace(trace, k=64)
    assert gvq.relative_error(trace.gradient(3, 7)) < 1e-5
    assert gvq.captured_energy == pytest.approx(1.0)


def test_reconstruction_error_falls_as_k_grows_on_a_real_trace(trace):
    # basis from the first three iterations, error measured on the last one
    later = [trace.gradient(w, trace.iterations - 1) for w in range(trace.workers)]
    errors = []
    for k in (1, 2, 4, 8, 16, 32):
        gvq = fitted_on_trace(trace, k)
        errors.append(np.mean([gvq.relative_error(g) for g in later]))
    assert np.all(np.diff(errors) < 0), errors
    assert errors[-1] < 0.5 * errors[0]
    # PCA is what makes it work: a random basis of the same size does far worse
    q, _ = np.linalg.qr(np.random.default_rng(2).standard_normal((64, 8)))
    random_basis = GradiVeQ.from_basis(q)
    random_error = np.mean([random_basis.relative_error(g) for g in later])
    assert errors[3] < random_error - 0.2, (errors[3], random_error)


def test_quantized_coefficients_aggregate_through_the_lanes(trace):
    """Compress, QSGD-quantize, sum the packed words as the switch does, decompress."""
    gvq = fitted_on_trace(trace, k=16)
    i, workers = trace.iterations - 1, trace.workers
    coeffs = [gvq.compress(trace.gradient(w, i)) for w in range(workers)]
    fmt = LaneFormat(8, workers)
    chunk = 32 * fmt.lanes
    exps = agree_exponents(*[chunk_exponents(c, chunk) for c in coeffs])
    words = np.zeros(fmt.words_for(len(coeffs[0])), dtype=np.uint32)
    for w, c in enumerate(coeffs):
        words += Quantizer(fmt, np.random.default_rng(w)).encode(c, exps, chunk)
    total = Quantizer(fmt).decode(words, exps, len(coeffs[0]), chunk)
    # the coefficient sum is off by at most one level per worker
    step = np.repeat(np.ldexp(1.0, exps.astype(int)), chunk)[: len(total)] / fmt.levels
    exact_coeffs = np.sum(coeffs, axis=0, dtype=np.float64)
    assert np.all(np.abs(total - exact_coeffs) <= workers * step * (1 + 1e-5))
    # and the decompressed aggregate stays close to the exact fp32 sum
    exact = trace.exact_sum(i)
    aggregate = gvq.decompress(total, trace.elements)
    assert np.linalg.norm(aggregate - exact) < 0.5 * np.linalg.norm(exact)


def test_misuse_is_refused():
    with pytest.raises(ValueError):
        GradiVeQ(d=8, k=9)
    with pytest.raises(ValueError):
        GradiVeQ(d=8, k=0)
    gvq = GradiVeQ(d=8, k=2)
    with pytest.raises(RuntimeError, match="fit"):
        gvq.compress(np.zeros(16))
    with pytest.raises(ValueError, match=r"\(S, 8\)"):
        gvq.fit(np.zeros((10, 7)))
    with pytest.raises(ValueError, match="span"):
        gvq.fit(np.ones((1, 8)))
    gvq.fit(np.random.default_rng(3).standard_normal((20, 8)))
    with pytest.raises(ValueError, match="whole slices"):
        gvq.decompress(np.zeros(3))
    with pytest.raises(ValueError, match="orthonormal"):
        GradiVeQ.from_basis(np.ones((8, 2)))


def layered(trace, d=64, k=8):
    return LayeredGradiVeQ([(layer.name, layer.size) for layer in trace.layers], d, k)


def test_layers_are_compressed_apart_and_small_ones_travel_as_they_are(trace):
    lg = layered(trace)
    sizes = {name: size for name, size in lg.layers}
    compressed = {name for (name, _), part in zip(lg.layers, lg.parts) if part is not None}
    assert compressed == {name for name, size in sizes.items() if -(-size // 64) >= 8}
    lg.fit([trace.exact_sum(0)])
    g = trace.exact_sum(3).astype(np.float32)
    c = lg.compress(g)
    assert len(c) == lg.compressed_size() < len(g) / 3
    back = lg.decompress(c)
    start = 0  # the raw layers come back exactly
    for (name, size), part in zip(lg.layers, lg.parts):
        if part is None:
            assert np.array_equal(back[start:start + size], g[start:start + size]), name
        start += size
    # linear: the sum of the workers' compressed gradients is the compressed sum
    summed = np.sum([lg.compress(trace.gradient(w, 3)) for w in range(trace.workers)],
                    axis=0, dtype=np.float64)
    np.testing.assert_allclose(summed, c, atol=1e-5 * np.abs(c).max())
    assert 0 < lg.energy <= 1 and 0 <= lg.projection_error(g) < 1


def test_refreshing_the_basis_keeps_more_of_later_gradients(trace):
    once, refreshed = layered(trace), layered(trace)
    once.fit([trace.exact_sum(0)])
    refreshed.fit([trace.exact_sum(8)])
    late = trace.exact_sum(trace.iterations - 1)
    assert refreshed.projection_error(late) < once.projection_error(late)


def test_the_schedule_says_which_iterations_are_exact():
    assert [GradiVeQSchedule(2, 0).exact(i) for i in range(6)] == [1, 1, 0, 0, 0, 0]
    assert [GradiVeQSchedule(1, 3).exact(i) for i in range(10)] == \
        [1, 0, 0, 0, 1, 0, 0, 0, 1, 0]
    with pytest.raises(ValueError):
        GradiVeQSchedule(0, 1)
