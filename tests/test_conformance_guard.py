"""Conformance suite, source validation: which ports admit which sources, and where
results may enter (see ``test_conformance.py`` for the targets it runs on).
"""

from __future__ import annotations

import time

import numpy as np
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether

from qaina_bench.harness.switches.jobs import Worker, int_to_ip, ip_to_int, program_guard
from qaina_bench.p4.constants import Drop
from qaina_bench.p4.header import FLAG_RESULT, FLAG_RETX, QAINA_UDP_PORT

# lab and sw are the suite's fixtures
from conformance_lab import (AGG_IP, AGG_MAC, OTHER_IP, QAINA, WORKERS, add_job, check_result,
                             contribution, count, lab, mac, one_round, results, send, sw,
                             wrapping_sum)


def guard_ports(lab):
    """Ports 1..4 face their workers and admit only their addresses; port 5 is an
    uplink: it admits the other subnet's host, and results of the aggregator."""
    for w in WORKERS:
        program_guard(lab.conn, w.port, [w.ip])
    program_guard(lab.conn, 5, [ip_to_int(OTHER_IP)], results_from=[ip_to_int(AGG_IP)])


def udp_frame(src: str, dst: str, payload: bytes = b"hello", sport=1234, dport=5678):
    return (Ether(src="02:00:00:00:00:99", dst="02:00:00:00:00:05") / IP(src=src, dst=dst)
            / UDP(sport=sport, dport=dport) / payload)


def result_frame(src: str, dst: Worker, words, flags=FLAG_RESULT, job_id=7):
    return (Ether(src=AGG_MAC, dst=mac(dst.mac)) / IP(src=src, dst=int_to_ip(dst.ip))
            / UDP(sport=QAINA_UDP_PORT, dport=QAINA_UDP_PORT)
            / QAINA(job_id=job_id, worker=dst.index, flags=flags, words=[int(x) for x in words]))


def wait_drops(lab, expected: dict, timeout: float = 10.0) -> dict:
    """Drops by reason once they read ``expected`` (or when ``timeout`` is over)."""
    deadline = time.monotonic() + timeout
    while True:
        drops = lab.counters("drops")
        got = {r: drops.get(r, (0, 0))[0] for r in expected}
        if got == expected or time.monotonic() > deadline:
            return got
        time.sleep(0.05)


def test_guarded_ports_admit_only_their_sources(sw):
    """A port facing a host takes only that host's address, for the aggregator or to be
    routed; an uplink takes the sources the control plane listed for it."""
    guard_ports(sw)
    job = add_job(sw)
    w0, w1, w2 = job.workers[:3]
    rng = np.random.default_rng(10)
    _, words = one_round(sw, job, rng, slot=1)
    for w in job.workers:
        got = results(sw, w.port, count=1)
        assert len(got) == 1
        check_result(got[0], job, w, wrapping_sum(words))
    send(sw, job, 0, words[0], slot=2)  # leave a slot half-aggregated
    assert count(sw, "agg_packets", 0, 5, timeout=10.0) == 5
    before = sw.registers()
    spoofed = [
        (1, contribution(w1, job.job_id, words[1], slot=2)),  # another member's address
        (1, contribution(w0, job.job_id, words[0], slot=2, src_ip="10.0.0.99")),
        (1, contribution(w0, job.job_id, words[0], slot=2, src_ip=AGG_IP)),
        (1, udp_frame(int_to_ip(w1.ip), OTHER_IP)),  # to be routed, with w1's address
        (1, udp_frame("10.0.1.5", int_to_ip(w2.ip))),  # the uplink's host, from a host port
        (3, udp_frame(AGG_IP, int_to_ip(w0.ip), b"x" * 300)),  # the aggregator's address
        (5, udp_frame("10.0.1.6", int_to_ip(w0.ip))),  # on the uplink, not listed there
        (5, udp_frame(int_to_ip(w2.ip), int_to_ip(w0.ip))),  # a host port's address
    ]
    for port, frame in spoofed:
        sw.hosts[port].send(frame)
    assert wait_drops(sw, {Drop.SPOOFED_SOURCE: len(spoofed)}) == {
        Drop.SPOOFED_SOURCE: len(spoofed)}
    assert all(results(sw, port, timeout=0.3) == [] for port in range(1, 6))
    assert sw.registers() == before
    # Listed sources still get through: routed both ways, and the slot completes.
    sw.hosts[1].send(udp_frame(int_to_ip(w0.ip), OTHER_IP, b"from w0"))
    got = results(sw, 5, count=1)
    assert len(got) == 1 and bytes(got[0][UDP].payload) == b"from w0"
    sw.hosts[5].send(udp_frame(OTHER_IP, int_to_ip(w2.ip), b"from the uplink"))
    got = results(sw, 3, count=1)
    assert len(got) == 1 and bytes(got[0][UDP].payload) == b"from the uplink"
    for k in (1, 2, 3):
        send(sw, job, k, words[k], slot=2)
    for w in job.workers:  # every copy taken: none reaches the next test late
        got = results(sw, w.port, count=1)
        assert len(got) == 1
        check_result(got[0], job, w, wrapping_sum(words))
    assert count(sw, "drops", Drop.SPOOFED_SOURCE, len(spoofed)) == len(spoofed)


def test_results_enter_only_where_their_aggregator_lies_upstream(sw):
    """A RESULT is made only by an aggregator's replication: from a host port it is
    dropped whatever its source (the aggregator's is spoofed there), and on an uplink
    it passes only from the aggregator the control plane declared upstream."""
    guard_ports(sw)
    job = add_job(sw)
    w0, w2 = job.workers[0], job.workers[2]
    words = np.arange(sw.words, dtype=np.uint32) * 3
    forged = [  # from w2's port to w0, with w2's own (admitted) address
        (3, result_frame(int_to_ip(w2.ip), w0, words)),
        (3, result_frame(int_to_ip(w2.ip), w0, words, flags=FLAG_RESULT | FLAG_RETX)),
        (3, result_frame(int_to_ip(w2.ip), w0, words, job_id=99)),
        # a QAINA header without its payload: the parser still extracts the header
        (3, bytes(result_frame(int_to_ip(w2.ip), w0, words))[:42 + 12]),
        # on the uplink, from a source that is no aggregator
        (5, result_frame(OTHER_IP, w0, words)),
    ]
    for port, frame in forged:
        sw.hosts[port].send(frame)
    sw.hosts[3].send(result_frame(AGG_IP, w0, words))  # the attack: a forged source
    assert wait_drops(sw, {Drop.FORGED_RESULT: len(forged), Drop.SPOOFED_SOURCE: 1}) == {
        Drop.FORGED_RESULT: len(forged), Drop.SPOOFED_SOURCE: 1}
    assert all(results(sw, port, timeout=0.3) == [] for port in range(1, 6))
    # What is not a result passes: a QAINA packet without RESULT between hosts ...
    sw.hosts[3].send(result_frame(int_to_ip(w2.ip), w0, words, flags=FLAG_RETX))
    got = results(sw, 1, count=1)
    assert len(got) == 1 and got[0][QAINA].flags == FLAG_RETX
    # ... and the declared aggregator's result on the uplink.
    sw.hosts[5].send(result_frame(AGG_IP, w0, words))
    got = results(sw, 1, count=1)
    assert len(got) == 1 and list(got[0][QAINA].words) == [int(x) for x in words]
    assert got[0][IP].src == AGG_IP and got[0][IP].ttl == 63
    drops = sw.counters("drops")
    assert drops[Drop.FORGED_RESULT][0] == len(forged)
    assert drops.get(Drop.NO_ROUTE, (0, 0))[0] == 0
