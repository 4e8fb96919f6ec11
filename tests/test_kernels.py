"""The compiled one-pass kernels give what the numpy reference gives, bit for bit.

``Quantizer.quantize_into`` against ``encode`` (``encodings`` packed by
``LaneFormat.pack_lanes``) and ``quantize``; ``Quantizer.dequantize_words`` against
``decode`` (``unpack_sum`` and ``dequantize_sum``): for every bit width, packed and
unpacked, stochastic and nearest rounding, every scale rule, short last chunks, with
and without the levels and level sums kept.
"""

from __future__ import annotations

import numpy as np
import pytest

from qaina_bench.hosts.lanes import BIT_WIDTHS, LaneFormat
from qaina_bench.hosts.quantize import Quantizer, scale_rule, SIGN_MEAN

WORDS = 32

CASES = [(b, n, packed, stochastic, rule)
         for b in BIT_WIDTHS for n in (1, 3, 8)
         for packed in (True, False) for stochastic in (True, False)
         for rule in ("maxpow2", "maxfine", "qsgd")
         if not (b == 32 and not packed) and not (b == 1 and rule != "maxpow2")]


def gradient(rng, elements):
    scales = 10.0 ** rng.uniform(-6, 2, -(-elements // 37))
    return (rng.standard_normal(elements) * np.repeat(scales, 37)[:elements]).astype(np.float32)


@pytest.mark.parametrize("bits, workers, packed, stochastic, rule", CASES)
def test_kernels_match_the_numpy_reference(bits, workers, packed, stochastic, rule):
    fmt = LaneFormat(bits, workers, packed)
    chunk = WORDS * fmt.lanes
    rng = np.random.default_rng([bits, workers, packed, stochastic])
    elements = 5 * chunk - 7  # a short last chunk
    grad = gradient(rng, elements)
    scale = SIGN_MEAN if bits == 1 else scale_rule(rule, chunk, 2 * chunk)
    codes = scale.codes(grad, chunk)
    codes[1] -= 1  # a scale below the chunk's maximum: values clip
    ref = Quantizer(fmt, np.random.default_rng(9), stochastic, scale)
    new = Quantizer(fmt, np.random.default_rng(9), stochastic, scale)
    words = ref.encode(grad, codes, chunk)
    levels_ref = Quantizer(fmt, np.random.default_rng(9), stochastic, scale).quantize(
        grad, codes, chunk)
    payload = np.zeros((len(codes), WORDS), dtype=">u4")
    levels = np.zeros(elements, dtype=np.int32)
    new.quantize_into(grad, codes, chunk, payload, levels)
    idle = fmt.pack_lanes(np.full(fmt.lanes, fmt.offset, dtype=np.uint32))[0]  # all lanes 0
    padded = np.full(len(codes) * WORDS, idle, dtype=np.uint32)
    padded[:len(words)] = words
    assert np.array_equal(payload.astype(np.uint32).reshape(-1), padded)
    assert np.array_equal(levels, levels_ref)
    # Without levels, full rows take the kernel's path without per-element checks.
    fast = np.zeros_like(payload)
    Quantizer(fmt, np.random.default_rng(9), stochastic, scale).quantize_into(
        grad, codes, chunk, fast)
    assert np.array_equal(fast.astype(np.uint32).reshape(-1), padded)
    # Sums of ``workers`` such payloads, as the switch makes them (wrapping).
    total = sum(payload.astype(np.uint32).astype(np.uint64) for _ in range(workers))
    summed = (total & 0xFFFFFFFF).astype(">u4")
    sums = np.zeros(elements, dtype=np.int64)
    out = new.dequantize_words(summed, codes, elements, chunk, sums)
    flat = summed.astype(np.uint32).reshape(-1)
    assert np.array_equal(sums, fmt.unpack_sum(flat, elements))
    expected = ref.decode(flat, codes, elements, chunk)
    assert out.dtype == expected.dtype == np.float32
    assert np.array_equal(out, expected)
    assert np.array_equal(new.dequantize_words(summed, codes, elements, chunk), expected)


def test_kernels_write_into_strided_packet_rows():
    """The payload of datagrams in one array (rows a datagram apart) is filled in place."""
    fmt = LaneFormat(4, 8)
    chunk = WORDS * fmt.lanes
    from qaina_bench.p4.header import wire
    d = np.zeros(3, dtype=wire(WORDS).dtype)
    grad = gradient(np.random.default_rng(1), 3 * chunk)
    codes = scale_rule("maxpow2", chunk).codes(grad, chunk)
    Quantizer(fmt, np.random.default_rng(2)).quantize_into(grad, codes, chunk, d["words"])
    expected = Quantizer(fmt, np.random.default_rng(2)).encode(grad, codes, chunk)
    assert np.array_equal(d["words"].astype(np.uint32).reshape(-1), expected)
    assert not d["seq"].any() and not d["job_id"].any()  # the headers untouched


def test_relative_error_is_the_norm_of_the_difference():
    from qaina_bench.hosts.kernels import relative_error
    rng = np.random.default_rng(3)
    exact = rng.standard_normal(10_001).astype(np.float32)
    value = exact + rng.standard_normal(10_001).astype(np.float32) * 0.01
    want = np.linalg.norm(value.astype(np.float64) - exact) / np.linalg.norm(exact.astype(np.float64))
    assert relative_error(value, exact) == pytest.approx(want, rel=1e-12)
    assert relative_error(exact, exact) == 0.0
    zero = np.zeros(4, dtype=np.float32)
    assert relative_error(zero + 1, zero) == pytest.approx(2 / 1e-30)


WARM_CHECK = """
import numpy as np
from qaina_bench.hosts import kernels
from qaina_bench.hosts.lanes import LaneFormat
from qaina_bench.hosts.quantize import Quantizer, scale_rule
from qaina_bench.p4.header import wire
import tempfile
from qaina_bench.hosts.traces import load_exact_sums
kernels.warm()
KERNELS = (kernels.quantize_pack, kernels.unpack_scale, kernels.relative_error)
warmed = [len(k.signatures) for k in KERNELS]
for bits, stochastic in ((4, True), (4, False), (32, True)):
    fmt = LaneFormat(bits, 8)
    chunk = 256 * fmt.lanes
    d = np.zeros(3, dtype=wire(256).dtype)
    grad = np.linspace(-1, 1, 3 * chunk - 5, dtype=np.float32)
    codes = scale_rule("maxpow2", chunk).codes(grad, chunk)
    q = Quantizer(fmt, np.random.default_rng(1), stochastic)
    q.quantize_into(grad, codes, chunk, d["words"][1:])
    q.quantize_into(grad, codes, chunk, d["words"], np.zeros(len(grad), np.int32))
    q.dequantize_words(np.array(d["words"]), codes, len(grad), chunk)
    q.dequantize_words(np.array(d["words"]), codes, len(grad), chunk,
                       np.zeros(len(grad), np.int64))
    total = q.dequantize_words(np.array(d["words"]), codes, len(grad), chunk)
    kernels.relative_error(total, grad)  # exact sums of the agent's own
    with tempfile.TemporaryDirectory() as tmp:  # the run's file of them, mapped
        np.save(tmp + "/exact.npy", grad[None, :])
        kernels.relative_error(total, load_exact_sums(tmp + "/exact.npy", 1, len(grad))[0])
after = [len(k.signatures) for k in KERNELS]
print(warmed, after)
assert after == warmed, (warmed, after)
"""


def test_warm_covers_what_an_agent_calls():
    """After ``warm()`` an agent's calls (payloads inside whole datagrams, results in
    rows of their own) compile nothing: a fresh interpreter, so that no earlier test
    has compiled them already."""
    import subprocess
    import sys
    res = subprocess.run([sys.executable, "-c", WARM_CHECK], capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
