"""Ring all-reduce on loopback: exact wrapping sums and maxima at every worker."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from conftest import free_port
from qaina_bench.hosts.ring import Ring, RingError, tcp_socket


def run_ring(vectors, op, congestion=None):
    n = len(vectors)
    peers = [("127.0.0.1", free_port()) for _ in range(n)]
    rings = [Ring(k, peers, congestion) for k in range(n)]
    out, errors = [None] * n, []

    def worker(k):
        try:
            rings[k].connect(timeout=10)
            out[k] = rings[k].all_reduce(vectors[k].copy(), op)
        except Exception as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    said = [r.tcp_congestion for r in rings]
    for r in rings:
        r.close()
    assert not errors, errors
    return out, rings, said


@pytest.mark.parametrize("n, length", [(1, 10), (2, 7), (4, 1000), (5, 3)])
def test_ring_sums_wrap_like_the_switch(n, length):
    rng = np.random.default_rng(n)
    vectors = [rng.integers(0, 2**32, length, dtype=np.uint64).astype(np.uint32)
               for _ in range(n)]
    out, rings, _ = run_ring(vectors, np.add)
    expected = (np.sum(np.array(vectors, dtype=np.uint64), axis=0) % 2**32).astype(np.uint32)
    for k in range(n):
        assert np.array_equal(out[k], expected)
    if n > 1:  # each worker moves 2 (n - 1) / n of the vector each way
        assert rings[0].bytes_sent == pytest.approx(2 * (n - 1) / n * 4 * length, abs=8 * n)


def test_ring_maximum_of_exponents():
    vectors = [np.array([-3, 5, -100, 7], dtype=np.int8), np.array([2, -1, -90, 7], dtype=np.int8),
               np.array([0, 0, -100, -7], dtype=np.int8)]
    out, _, _ = run_ring(vectors, np.maximum)
    for k in range(3):
        assert out[k].tolist() == [2, 5, -90, 7]


def test_ring_connections_use_the_congestion_control_asked():
    """Both of a worker's connections (the one it makes, the one it accepts) use the
    congestion control given: reno, which every Linux has and none defaults to."""
    vectors = [np.arange(4, dtype=np.uint32) for _ in range(3)]
    _, _, said = run_ring(vectors, np.add, congestion="reno")
    assert said == ["reno"] * 3
    _, _, said = run_ring(vectors, np.add)
    default = open("/proc/sys/net/ipv4/tcp_congestion_control").read().strip()
    assert said == [default] * 3


def test_an_unknown_congestion_control_is_one_clear_error():
    with pytest.raises(RingError, match="TCP congestion control 'nosuch' refused: No such file"):
        tcp_socket("nosuch", RingError)
