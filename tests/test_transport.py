"""The agent's transport rules: RFC 6298 timer arithmetic, Karn's rule, backoff, and
the AIMD window (the behaviour on real links is in tests/test_testbed.py)."""

from __future__ import annotations

import pytest

from qaina_bench.hosts.transport import INITIAL_WINDOW, CongestionWindow, RttEstimator


def test_rto_follows_rfc_6298():
    est = RttEstimator(rto_min=0.001, rto_max=60.0, initial=1.0)
    assert est.rto == 1.0  # before any sample
    est.sample(0.100)
    assert est.srtt == pytest.approx(0.100) and est.rttvar == pytest.approx(0.050)
    assert est.rto == pytest.approx(0.100 + 4 * 0.050)
    est.sample(0.200)
    assert est.rttvar == pytest.approx(0.75 * 0.050 + 0.25 * 0.100)
    assert est.srtt == pytest.approx(0.875 * 0.100 + 0.125 * 0.200)
    assert est.rto == pytest.approx(est.srtt + 4 * est.rttvar)


def test_a_batch_of_samples_is_the_samples_one_by_one():
    one, batch = RttEstimator(0.001, 60.0), RttEstimator(0.001, 60.0)
    rtts = [0.05, 0.2, 0.011, 0.4, 0.09]
    for rtt in rtts:
        one.sample(rtt)
    batch.backoff()
    batch.samples(rtts[:2])
    batch.samples(rtts[2:])
    assert (batch.srtt, batch.rttvar, batch.rto, batch.backoffs) == \
        (one.srtt, one.rttvar, one.rto, 0)


def test_rto_is_clamped_and_backs_off_until_a_new_sample():
    est = RttEstimator(rto_min=0.1, rto_max=1.0)
    est.sample(0.001)
    assert est.rto == 0.1  # never below the minimum
    est.backoff()
    est.backoff()
    assert est.rto == pytest.approx(0.4) and est.backoffs == 2
    for _ in range(5):
        est.backoff()
    assert est.rto == 1.0  # never above the maximum
    est.sample(0.001)
    assert est.rto == 0.1 and est.backoffs == 0


def test_window_slow_starts_then_grows_by_one_per_window():
    w = CongestionWindow(limit=64)
    assert w.allowed == INITIAL_WINDOW
    for _ in range(10):
        w.on_result()
    assert w.allowed == INITIAL_WINDOW + 10  # one per result below ssthresh
    w.on_loss(chunk=5, next_chunk=30)
    assert w.allowed == (INITIAL_WINDOW + 10) // 2 == w.ssthresh
    before = w.cwnd
    for _ in range(int(before)):  # one window of results: about one more chunk
        w.on_result()
    assert w.cwnd == pytest.approx(before + 1, abs=0.1)


def test_window_is_cut_once_per_window_of_data_and_never_exceeds_the_slots():
    w = CongestionWindow(limit=8)
    for _ in range(100):
        w.on_result()
    assert w.allowed == 8
    w.on_loss(chunk=10, next_chunk=20)
    w.on_loss(chunk=12, next_chunk=21)  # the same window: no second cut
    assert w.allowed == 4 and w.losses == 1
    w.on_loss(chunk=20, next_chunk=28)  # sent after the first cut: cut again
    assert w.allowed == 2 and w.losses == 2
    for _ in range(3):
        w.on_loss(chunk=100 + 10 * _, next_chunk=105 + 10 * _)
    assert w.allowed == 1
