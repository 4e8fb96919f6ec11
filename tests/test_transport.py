"""The agent's transport rules: RFC 6298 timer arithmetic, Karn's rule, backoff, the
AIMD window, and a SlotStream's refusals on real UDP sockets over loopback (the
behaviour on real links is in tests/test_testbed.py)."""

from __future__ import annotations

import socket
import threading
import time

import numpy as np
import pytest

from qaina_bench.hosts.transport import (INITIAL_WINDOW, CongestionWindow,
                                         RttEstimator, SlotStream, StreamStalled,
                                         coalesce_delay)
from qaina_bench.p4.header import FLAG_RESULT, wire

WIRE = wire()


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


# -- SlotStream on real UDP sockets over loopback ------------------------------------
class FakeSwitch(threading.Thread):
    """The aggregator's side of one worker's stream on a loopback socket: for every
    chunk it answers with the datagrams a worker must refuse (from another sender, too
    short, another worker's result, a contribution rather than a result, the previous
    chunk's result again), then with the chunk's result, its words doubled."""

    def __init__(self, n: int):
        super().__init__(daemon=True)
        self.n = n
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(10)
        self.other = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.other.bind(("127.0.0.1", 0))
        self.received = 0
        self.refusable = 0  # datagrams sent that the worker must refuse

    def run(self):
        previous = None
        answered = set()
        while len(answered) < self.n:
            data, worker = self.sock.recvfrom(4096)
            self.received += 1
            chunk = np.frombuffer(data, dtype=WIRE.dtype)[0]
            result = chunk.copy()
            result["flags"] |= FLAG_RESULT
            result["words"] = 2 * chunk["words"]
            other_worker = result.copy()
            other_worker["worker"] += 1
            wrong = result.copy()
            wrong["words"] = 3 * chunk["words"]
            for sock, datagram in ((self.other, result.tobytes()),
                                   (self.sock, result.tobytes()[:-4]),
                                   (self.sock, wrong.tobytes() + bytes(4)),  # too long
                                   (self.sock, other_worker.tobytes()),
                                   (self.sock, chunk.tobytes())):
                sock.sendto(datagram, worker)
                self.refusable += 1
            if previous is not None:
                self.sock.sendto(previous, worker)  # a duplicate
            previous = result.tobytes()
            self.sock.sendto(previous, worker)
            answered.add(int(chunk["seq"]))

    def close(self):
        self.sock.close()
        self.other.close()


def worker_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.setblocking(False)
    return sock


def test_a_stream_refuses_what_is_not_its_result_and_counts_each():
    n, slots = 12, 4
    switch = FakeSwitch(n)
    switch.start()
    sock = worker_socket()
    try:
        stream = SlotStream(sock, switch.sock.getsockname(), job_id=3, worker=1, slot_base=8,
                            slots=slots, rto_min=5.0, rto_max=10.0, stall_timeout=10.0)

        def encode(a, b, agreed, words):
            words[a:b] = np.arange(a, b)[:, None] * 10 + np.arange(WIRE.words)

        exps = np.arange(n, dtype=np.int8) - 5
        results, agreed, stats = stream.exchange(exps, encode)
        switch.join(10)
    finally:
        sock.close()
        switch.close()
    expected = 2 * (np.arange(n)[:, None] * 10 + np.arange(WIRE.words))
    assert np.array_equal(results.astype(np.int64), expected)
    assert np.array_equal(agreed, exps)
    assert stats.retransmissions == 0 and switch.received == n
    assert stats.refused == switch.refusable == 5 * n
    assert stats.duplicates == n - 1 and stats.packets_received == 2 * n - 1


def test_a_stream_whose_results_never_come_stalls_with_the_reason():
    silent = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    silent.bind(("127.0.0.1", 0))
    sock = worker_socket()
    try:
        stream = SlotStream(sock, silent.getsockname(), job_id=1, worker=0, slot_base=0,
                            slots=4, rto_min=0.05, rto_max=0.1, stall_timeout=0.5)
        t0 = time.monotonic()
        with pytest.raises(StreamStalled, match=r"no result for 0 s with 4 chunks outstanding"):
            stream.exchange(np.zeros(8, dtype=np.int8), lambda a, b, agreed, words: None)
        assert 0.5 <= time.monotonic() - t0 < 5
    finally:
        sock.close()
        silent.close()


def test_the_start_signal_gives_its_contents_or_times_out(tmp_path):
    import threading
    from qaina_bench.hosts.agent import wait_for_start
    go = tmp_path / "go"
    with pytest.raises(TimeoutError, match=r"no start signal .*go\) within 0 s"):
        wait_for_start(str(go), 0.05)
    timer = threading.Timer(0.05, lambda: go.write_text('{"slot_base": 64}'))
    timer.start()
    assert wait_for_start(str(go), 5) == {"slot_base": 64}
    timer.join()
    go.write_text("")
    assert wait_for_start(str(go), 5) == {}


def test_coalescing_waits_only_for_the_rest_of_a_batch_that_is_on_the_way():
    now, limit = 100.0, 0.004
    assert coalesce_delay(8, 8, 30, 0.001, limit, None, now) == 0  # a whole batch came
    assert coalesce_delay(2, 8, 5, 0.001, limit, None, now) == 0  # the rest is not out
    assert coalesce_delay(2, 8, 6, 0.0001, limit, None, now) == pytest.approx(0.0006)
    assert coalesce_delay(1, 8, 30, 0.01, limit, None, now) == limit  # at most this
    assert coalesce_delay(1, 8, 30, 0.01, limit, now + 0.0005, now) == pytest.approx(0.0005)
    assert coalesce_delay(1, 8, 30, 0.01, limit, now - 1, now) == 0  # the timer is due


class PacedSwitch(FakeSwitch):
    """Answers every chunk with its result, one result every ``gap`` seconds, as a
    shaped link delivers them."""

    def __init__(self, n: int, gap: float):
        super().__init__(n)
        self.gap = gap

    def run(self):
        answered = 0
        while answered < self.n:
            data, worker = self.sock.recvfrom(4096)
            result = np.frombuffer(data, dtype=WIRE.dtype)[0].copy()
            result["flags"] |= FLAG_RESULT
            time.sleep(self.gap)
            self.sock.sendto(result.tobytes(), worker)
            answered += 1


def test_results_that_trickle_in_are_taken_in_batches():
    n, slots = 96, 32  # batches of slots // 4 = 8 results
    switch = PacedSwitch(n, gap=0.0005)
    switch.start()
    sock = worker_socket()
    try:
        stream = SlotStream(sock, switch.sock.getsockname(), job_id=1, worker=0, slot_base=0,
                            slots=slots, rto_min=5.0, rto_max=10.0, stall_timeout=10.0)
        exps = np.zeros(n, dtype=np.int8)
        results, agreed, stats = stream.exchange(exps, lambda a, b, agreed, words: None)
        switch.join(10)
    finally:
        sock.close()
        switch.close()
    assert stats.packets_received == n and stats.retransmissions == 0
    # one wakeup per result without coalescing; with it, about one per batch
    assert stats.wakeups <= n // 2, stats.wakeups
    assert 0 < stats.lingered_s
