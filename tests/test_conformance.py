"""Conformance suite of the QAINA pipeline: packets in, packets out, counters.

Every case runs against each target of the ``lab`` fixture: the embedded switch
everywhere, BMv2 ``simple_switch_grpc`` where it is installed, each with every build
of qaina.p4 (32 payload words, and the 64-, 128- and 256-word ones). The switch is a
real process on real veth pairs, programmed over P4Runtime by the harness's control
plane. Ports 1..4 face the workers, port 5 another host.
"""

from __future__ import annotations

import random
import struct
import time

import numpy as np
import pytest
from scapy.layers.inet import IP, TCP, UDP
from scapy.layers.l2 import ARP, Ether
from scapy.utils import checksum

from qaina_bench.harness.jobs import (Job, Upstream, Worker, aggregator_ip, aggregator_mac,
                                      int_to_ip, ip_to_int, mac_to_int, program_aggregator,
                                      program_guard, program_job, program_route, release_job,
                                      result_entry)
from qaina_bench.hosts.lanes import LaneFormat
from qaina_bench.p4.constants import POOL_SLOTS, Drop
from conftest import kinds, open_lab
from qaina_bench.p4.header import (FALLBACK_PARTIAL, FALLBACK_WORKER, FLAG_FALLBACK,
                                   FLAG_FLUSH, FLAG_RESULT, FLAG_RETX, PAYLOAD_WORDS,
                                   QAINA_UDP_PORT, scapy_layer)

QAINA = scapy_layer()
AGG_IP, AGG_MAC = aggregator_ip(1), aggregator_mac(1)
OTHER_IP = "10.0.1.5"
WORKERS = [Worker(i, ip_to_int(f"10.0.0.{i + 1}"), mac_to_int(f"02:00:00:00:00:{i + 1:02x}"),
                  port=i + 1) for i in range(4)]


def mac(value: int) -> str:
    return ":".join(f"{value >> s & 0xFF:02x}" for s in range(40, -8, -8))


@pytest.fixture(scope="module", params=kinds("embedded", "embedded-sockets", "bmv2", *(
    f"{kind}-w{words}" for kind in ("embedded", "bmv2") for words in PAYLOAD_WORDS[1:])))
def lab(request, tmp_path_factory):
    lab = open_lab(request.param, tmp_path_factory)
    yield lab
    lab.close()


@pytest.fixture
def sw(lab):
    """The lab with a fresh pipeline, the aggregator address and host routes."""
    lab.reset()
    program_aggregator(lab.conn, ip_to_int(AGG_IP))
    for w in WORKERS:
        program_route(lab.conn, w.ip, 32, w.port)
    program_route(lab.conn, ip_to_int("10.0.1.0"), 24, 5)
    return lab


def add_job(lab, job_id=7, index=0, bits=4, workers=WORKERS, base=0, count=8) -> Job:
    job = Job(job_id, index, LaneFormat(bits, len(workers)), base, count,
              [Worker(k, w.ip, w.mac, w.port) for k, w in enumerate(workers)])
    program_job(lab.conn, job)
    return job


def contribution(w: Worker, job_id: int, words, slot=0, ver=0, exp=0, seq=0, flags=0,
                 worker=None, src_ip=None):
    return (Ether(src=mac(w.mac), dst=AGG_MAC)
            / IP(src=src_ip or int_to_ip(w.ip), dst=AGG_IP)
            / UDP(sport=QAINA_UDP_PORT, dport=QAINA_UDP_PORT)
            / QAINA(job_id=job_id, worker=w.index if worker is None else worker, flags=flags,
                    slot=slot, ver=ver, exp=exp, seq=seq, words=[int(x) for x in words]))


def send(lab, job: Job, worker: int, words, **kw):
    w = job.workers[worker]
    lab.hosts[w.port].send(contribution(w, job.job_id, words, **kw))


def results(lab, port: int, count=None, timeout=1.0):
    return [Ether(f) for f in lab.hosts[port].recv(timeout=timeout, count=count)]


def count(lab, name: str, index: int, expected: int, timeout: float = 2.0) -> int:
    """Packets in cell ``index`` of counter ``name`` once it reads ``expected``, or
    when ``timeout`` is over (a switch may still be working on the last packets)."""
    deadline = time.monotonic() + timeout
    while True:
        value = lab.counters(name).get(index, (0, 0))[0]
        if value == expected or time.monotonic() > deadline:
            return value
        time.sleep(0.02)


def wrapping_sum(word_lists) -> np.ndarray:
    return (np.sum(np.array(word_lists, dtype=np.uint64), axis=0) % 2**32).astype(np.uint32)


def ipv4_checksum_ok(pkt) -> bool:
    return checksum(bytes(pkt[IP])[:20]) == 0


def check_result(pkt, job: Job, worker: Worker, words, exp=None, seq=None, flags=FLAG_RESULT):
    q = pkt[QAINA]
    assert q.flags == flags
    assert q.job_id == job.job_id and q.worker == worker.index
    assert pkt[Ether].dst == mac(worker.mac) and pkt[Ether].src == AGG_MAC
    assert pkt[IP].dst == int_to_ip(worker.ip) and pkt[IP].src == AGG_IP
    assert pkt[IP].ttl == 64 and pkt[UDP].chksum == 0
    assert ipv4_checksum_ok(pkt)
    assert list(q.words) == [int(x) for x in words]
    if exp is not None:
        assert q.exp == exp
    if seq is not None:
        assert q.seq == seq


def one_round(lab, job: Job, rng, slot=0, ver=0, seq=0):
    """Every worker sends random levels in ``slot``; returns (levels, words) per worker."""
    fmt = job.fmt
    levels, words = [], []
    for k in range(fmt.workers):
        lv = (rng.integers(0, 2, lab.words * fmt.lanes) if fmt.bits == 1 else
              rng.integers(-fmt.levels, fmt.levels + 1, lab.words * fmt.lanes))
        levels.append(lv)
        words.append(fmt.pack(lv))
        send(lab, job, k, words[-1], slot=slot, ver=ver, exp=k - 2, seq=seq)
    return levels, words


@pytest.mark.smoke
@pytest.mark.parametrize("bits", [2, 4, 8, 32])
def test_aggregation_gives_exact_lane_sum(sw, bits):
    job = add_job(sw, bits=bits)
    rng = np.random.default_rng(bits)
    levels, words = one_round(sw, job, rng, slot=3, seq=41)
    total = wrapping_sum(words)
    for w in job.workers:
        got = results(sw, w.port, count=1)
        assert len(got) == 1, f"worker {w.index} got {len(got)} results"
        check_result(got[0], job, w, total, exp=1, seq=41)
        level_sum = job.fmt.unpack_sum(np.array(got[0][QAINA].words, dtype=np.uint32),
                                       sw.words * job.fmt.lanes)
        assert np.array_equal(level_sum, np.sum(levels, axis=0))
    assert count(sw, "slots_opened", 0, 1) == 1
    assert count(sw, "slots_closed", 0, 1) == 1
    assert count(sw, "agg_packets", 0, 4) == 4
    assert count(sw, "results_sent", 0, 4) == 4


@pytest.mark.parametrize("bits", [1, 2, 4, 8])
def test_lanes_never_carry_at_extreme_values(sw, bits):
    job = add_job(sw, bits=bits)
    fmt, n, count = job.fmt, job.fmt.workers, sw.words * job.fmt.lanes
    top = 1 if bits == 1 else fmt.levels
    bottom = 0 if bits == 1 else -fmt.levels
    for slot, level, expect in ((0, top, n * fmt.levels if bits > 1 else n),
                                (1, bottom, -n * fmt.levels if bits > 1 else -n)):
        for k in range(n):
            send(sw, job, k, fmt.pack(np.full(count, level)), slot=slot)
        got = results(sw, 1, count=1)
        assert len(got) == 1
        sums = fmt.unpack_sum(np.array(got[0][QAINA].words, dtype=np.uint32), count)
        assert np.all(sums == expect)
        for port in (2, 3, 4):
            results(sw, port, count=1)


def test_duplicate_contribution_is_not_added_twice(sw):
    job = add_job(sw)
    rng = np.random.default_rng(1)
    words = [job.fmt.pack(rng.integers(-7, 8, sw.words * job.fmt.lanes)) for _ in range(4)]
    send(sw, job, 0, words[0])
    send(sw, job, 0, words[0], flags=FLAG_RETX)
    for k in (1, 2, 3):
        send(sw, job, k, words[k])
    for w in job.workers:
        got = results(sw, w.port, count=1)
        assert len(got) == 1
        check_result(got[0], job, w, wrapping_sum(words))
    assert count(sw, "drops", Drop.DUPLICATE, 1) == 1
    assert count(sw, "agg_packets", 0, 4) == 4


def test_retransmission_after_completion_gets_stored_result(sw):
    job = add_job(sw)
    rng = np.random.default_rng(2)
    _, words = one_round(sw, job, rng, slot=5, seq=9)
    for w in job.workers:
        assert len(results(sw, w.port, count=1)) == 1
    send(sw, job, 2, words[2], slot=5, seq=9, exp=0, flags=FLAG_RETX)
    got = results(sw, 3, count=1)
    assert len(got) == 1
    check_result(got[0], job, job.workers[2], wrapping_sum(words), exp=1, seq=9,
                 flags=FLAG_RESULT | FLAG_RETX)
    for port in (1, 2, 4):
        assert results(sw, port, timeout=0.3) == []
    assert count(sw, "retx_answered", 0, 1) == 1
    assert count(sw, "results_sent", 0, 5) == 5


def test_slot_reuse_alternates_copies_and_keeps_the_shadow(sw):
    job = add_job(sw)
    rng = np.random.default_rng(3)
    sums = []
    for use, ver in enumerate((0, 1)):
        _, words = one_round(sw, job, rng, slot=2, ver=ver, seq=use)
        sums.append(wrapping_sum(words))
        for w in job.workers:
            got = results(sw, w.port, count=1)
            assert len(got) == 1
            check_result(got[0], job, w, sums[-1], seq=use)
    # Third use of the slot (copy 0 again) starts while worker 1 still lacks use 2.
    fresh = job.fmt.pack(rng.integers(-7, 8, sw.words * job.fmt.lanes))
    send(sw, job, 0, fresh, slot=2, ver=0, seq=2)
    assert all(results(sw, w.port, timeout=0.2) == [] for w in job.workers)
    send(sw, job, 1, np.zeros(sw.words, dtype=np.uint32), slot=2, ver=1, seq=1, flags=FLAG_RETX)
    got = results(sw, 2, count=1)
    assert len(got) == 1
    check_result(got[0], job, job.workers[1], sums[1], seq=1, flags=FLAG_RESULT | FLAG_RETX)
    # ... and the third use still completes with exactly its own contributions.
    rest = [job.fmt.pack(rng.integers(-7, 8, sw.words * job.fmt.lanes)) for _ in range(3)]
    for k, words in zip((1, 2, 3), rest):
        send(sw, job, k, words, slot=2, ver=0, seq=2)
    for w in job.workers:
        got = results(sw, w.port, count=1)
        assert len(got) == 1
        check_result(got[0], job, w, wrapping_sum([fresh] + rest), seq=2)


def test_two_jobs_in_disjoint_slot_ranges_do_not_disturb_each_other(sw):
    job_a = add_job(sw, job_id=7, index=0, bits=4, workers=WORKERS[:2], base=0, count=4)
    job_b = add_job(sw, job_id=9, index=1, bits=32, workers=WORKERS[2:], base=4, count=4)
    rng = np.random.default_rng(4)
    wa = [job_a.fmt.pack(rng.integers(-7, 8, sw.words * job_a.fmt.lanes)) for _ in range(2)]
    wb = [job_b.fmt.pack(rng.integers(-1000, 1000, sw.words)) for _ in range(2)]
    for k in range(2):  # interleaved, same relative slot
        send(sw, job_a, k, wa[k], slot=1)
        send(sw, job_b, k, wb[k], slot=5)
    for job, words in ((job_a, wa), (job_b, wb)):
        for w in job.workers:
            got = results(sw, w.port, count=2, timeout=0.6)
            assert len(got) == 1, f"job {job.job_id} worker {w.index}: {len(got)} results"
            check_result(got[0], job, w, wrapping_sum(words))
    # A job cannot reach into the other job's range.
    send(sw, job_a, 0, wa[0], slot=5)
    assert count(sw, "drops", Drop.BAD_SLOT, 1) == 1
    for index in (0, 1):
        assert count(sw, "slots_closed", index, 1) == 1
        assert count(sw, "results_sent", index, 2) == 2


def test_slots_given_to_another_job_start_afresh(sw):
    """A job leaves with one use of a slot complete and one half done; a job given its
    slots next aggregates exactly its own contributions in both, from the first."""
    rng = np.random.default_rng(5)
    job_a = add_job(sw, job_id=7, index=0, base=0, count=4)
    one_round(sw, job_a, rng, slot=2)
    for w in job_a.workers:
        assert len(results(sw, w.port, count=1)) == 1
    for k in (0, 1):  # slot 3: half of a use
        send(sw, job_a, k, job_a.fmt.pack(rng.integers(-7, 8, sw.words * job_a.fmt.lanes)),
             slot=3)
    assert count(sw, "slots_opened", 0, 2) == 2
    release_job(sw.conn, job_a)
    job_b = add_job(sw, job_id=9, index=1, bits=8, base=0, count=4)
    for slot in (2, 3):
        _, words = one_round(sw, job_b, rng, slot=slot, seq=slot)
        for w in job_b.workers:
            got = results(sw, w.port, count=1)
            assert len(got) == 1, f"slot {slot}, worker {w.index}: {len(got)} results"
            check_result(got[0], job_b, w, wrapping_sum(words), seq=slot)
    assert count(sw, "slots_closed", 1, 2) == 2
    assert count(sw, "retx_answered", 1, 0) == 0
    # The job that left is gone: its packets are dropped.
    send(sw, job_a, 2, np.zeros(sw.words, dtype=np.uint32), slot=3)
    assert count(sw, "drops", Drop.UNKNOWN_JOB, 1) == 1


UPPER_IP, UPPER_MAC = aggregator_ip(9), aggregator_mac(9)


def lower_job(lab) -> Job:
    """Job 7 of 4 workers, two of which (ports 1, 2) are below this switch; the job's
    upper aggregator is behind port 5, where this switch is worker 1."""
    job = Job(7, 0, LaneFormat(4, 4), 0, 8, [Worker(k, w.ip, w.mac, w.port)
                                               for k, w in enumerate(WORKERS[:2])],
              Upstream(5, ip_to_int(UPPER_IP), mac_to_int(UPPER_MAC), 1))
    program_job(lab.conn, job)
    return job


def upper_result(job: Job, words, slot=0, ver=0, seq=0, exp=0, flags=FLAG_RESULT):
    return (Ether(src=UPPER_MAC, dst=AGG_MAC) / IP(src=UPPER_IP, dst=AGG_IP)
            / UDP(sport=QAINA_UDP_PORT, dport=QAINA_UDP_PORT)
            / QAINA(job_id=job.job_id, worker=1, flags=flags, slot=slot, ver=ver, exp=exp,
                    seq=seq, words=[int(x) for x in words]))


def check_partial(pkt, job: Job, words, exp: int, seq: int, flags=0):
    """``pkt`` is this switch's sum going up to the job's upper aggregator."""
    q = pkt[QAINA]
    assert (q.job_id, q.worker, q.flags, q.seq, q.exp) == (job.job_id, 1, flags, seq, exp)
    assert pkt[IP].src == AGG_IP and pkt[IP].dst == UPPER_IP and ipv4_checksum_ok(pkt)
    assert pkt[Ether].dst == UPPER_MAC and pkt[IP].ttl == 64
    assert list(q.words) == [int(x) for x in words]


def test_lower_aggregator_sends_its_sum_up_and_the_upper_result_down(sw):
    job = lower_job(sw)
    rng = np.random.default_rng(6)
    words = [job.fmt.pack(rng.integers(-7, 8, sw.words * job.fmt.lanes)) for _ in range(2)]
    for k in range(2):
        send(sw, job, k, words[k], slot=3, exp=k - 3, seq=11)
    up = results(sw, 5, count=1)
    assert len(up) == 1
    check_partial(up[0], job, wrapping_sum(words), exp=-2, seq=11)
    assert all(results(sw, w.port, timeout=0.2) == [] for w in job.workers)
    # A worker that times out before the result came down: the sum goes up again.
    send(sw, job, 0, words[0], slot=3, seq=11, flags=FLAG_RETX)
    again = results(sw, 5, count=1)
    assert len(again) == 1
    check_partial(again[0], job, wrapping_sum(words), exp=-2, seq=11, flags=FLAG_RETX)
    final = wrapping_sum(words + [job.fmt.pack(rng.integers(-7, 8, sw.words * job.fmt.lanes))])
    sw.hosts[5].send(upper_result(job, final, slot=3, seq=11, exp=4))
    for w in job.workers:
        got = results(sw, w.port, count=1)
        assert len(got) == 1
        check_result(got[0], job, w, final, exp=4, seq=11)
    # The same result again (the answer to the repeated sum) is stale: dropped.
    sw.hosts[5].send(upper_result(job, final, slot=3, seq=11, exp=4,
                                  flags=FLAG_RESULT | FLAG_RETX))
    assert count(sw, "drops", Drop.STALE_RESULT, 1) == 1
    # From now on a retransmission is answered here, from the stored result.
    send(sw, job, 1, words[1], slot=3, seq=11, flags=FLAG_RETX)
    got = results(sw, 2, count=1)
    assert len(got) == 1
    check_result(got[0], job, job.workers[1], final, exp=4, seq=11,
                 flags=FLAG_RESULT | FLAG_RETX)
    assert results(sw, 5, timeout=0.2) == [] and results(sw, 1, timeout=0.2) == []
    assert count(sw, "slots_closed", 0, 1) == 1


def test_lower_aggregator_takes_results_only_from_above_for_a_waiting_use(sw):
    job = lower_job(sw)
    zeros = np.zeros(sw.words, dtype=np.uint32)
    for k in range(2):
        send(sw, job, k, zeros, slot=1, seq=4)
    assert len(results(sw, 5, count=1)) == 1
    stale = count(sw, "drops", Drop.STALE_RESULT, 0)
    bad = count(sw, "drops", Drop.BAD_FLAGS, 0)
    sw.hosts[5].send(upper_result(job, zeros + 1, slot=1, seq=5))  # another use's seq
    sw.hosts[5].send(upper_result(job, zeros + 1, slot=2, seq=5))  # a slot with no use
    assert count(sw, "drops", Drop.STALE_RESULT, stale + 2) == stale + 2
    sw.hosts[3].send(upper_result(job, zeros + 1, slot=1, seq=4))  # not from above
    forged = upper_result(job, zeros + 1, slot=1, seq=4)
    forged[IP].src = OTHER_IP
    sw.hosts[5].send(forged)  # from above, but not the upper aggregator's address
    assert count(sw, "drops", Drop.BAD_FLAGS, bad + 2) == bad + 2
    assert all(results(sw, w.port, timeout=0.2) == [] for w in job.workers)
    sw.hosts[5].send(upper_result(job, zeros + 1, slot=1, seq=4))  # the right one
    for w in job.workers:
        got = results(sw, w.port, count=1)
        assert len(got) == 1
        check_result(got[0], job, w, zeros + 1, seq=4)


def fragment(pkt, more: bool, offset: int):
    """``pkt`` as an IPv4 fragment (MF flag, offset in 8-byte units), length kept."""
    frag = pkt.copy()
    frag[IP].flags = "MF" if more else 0
    frag[IP].frag = offset
    return frag


def vlan_tagged(pkt, tpid: int, vid: int = 5) -> bytes:
    """``pkt`` with a VLAN tag (TPID ``tpid``) after the MAC addresses."""
    raw = bytes(pkt)
    return raw[:12] + struct.pack("!HH", tpid, vid) + raw[12:]


def bad_packets(job: Job, words: int):
    """(name, frame, drop reason[, port]) for every kind of packet the switch must
    refuse; sent from port 1 unless a port is given."""
    w0, w1 = job.workers[0], job.workers[1]
    good = contribution(w0, job.job_id, range(words), slot=1)
    raw = bytes(good)
    rnd = random.Random(5)
    junk = bytes(rnd.getrandbits(8) for _ in range(120))
    junk = junk[:12] + b"\x88\xb5" + junk[14:]  # random bytes, local experimental ethertype
    base = Ether(src=mac(w0.mac), dst=AGG_MAC) / IP(src=int_to_ip(w0.ip), dst=AGG_IP)
    udp = UDP(sport=QAINA_UDP_PORT, dport=QAINA_UDP_PORT)
    return [
        ("random bytes", junk, Drop.NOT_IPV4),
        ("arp", Ether(src=mac(w0.mac), dst="ff:ff:ff:ff:ff:ff") / ARP(pdst=AGG_IP), Drop.NOT_IPV4),
        ("truncated ipv4", raw[:30], Drop.NOT_IPV4),
        ("random udp payload", base / udp / junk[:37], Drop.MALFORMED),
        ("truncated header", base / udp / raw[42:48], Drop.MALFORMED),
        ("truncated payload", base / udp / raw[42:42 + 12 + 64], Drop.MALFORMED),
        ("trailing bytes", base / udp / (raw[42:] + b"\0\0\0\0"), Drop.MALFORMED),
        ("another build's packet", contribution(w0, job.job_id, range(64 if words == 32 else 32),
                                                slot=1), Drop.MALFORMED),
        ("not udp", base / TCP(dport=QAINA_UDP_PORT) / raw[42:], Drop.MALFORMED),
        ("other udp port", base / UDP(sport=1, dport=4000) / raw[42:], Drop.MALFORMED),
        ("result flag", contribution(w0, job.job_id, range(words), flags=FLAG_RESULT), Drop.BAD_FLAGS),
        ("bad version", contribution(w0, job.job_id, range(words), ver=2), Drop.BAD_FLAGS),
        ("wrong job", contribution(w0, job.job_id + 1, range(words)), Drop.UNKNOWN_JOB),
        ("spoofed source", contribution(w0, job.job_id, range(words), src_ip="10.0.0.99"),
         Drop.NON_MEMBER),
        ("other member's index", contribution(w0, job.job_id, range(words), worker=1),
         Drop.BAD_WORKER),
        ("index beyond job", contribution(w1, job.job_id, range(words), worker=9),
         Drop.BAD_WORKER, w1.port),
        ("member's address, other port", contribution(w1, job.job_id, range(words), slot=3),
         Drop.WRONG_PORT),
        ("first fragment", fragment(good, more=True, offset=0), Drop.MALFORMED),
        ("later fragment", fragment(good, more=False, offset=8), Drop.MALFORMED),
        ("802.1Q tagged", vlan_tagged(good, 0x8100), Drop.NOT_IPV4),
        ("802.1ad tagged", vlan_tagged(good, 0x88A8), Drop.NOT_IPV4),
        ("slot after range", contribution(w0, job.job_id, range(words), slot=8), Drop.BAD_SLOT),
        ("slot below range", contribution(w0, job.job_id, range(words), slot=1), Drop.BAD_SLOT),
        ("slot beyond pool", contribution(w0, job.job_id, range(words), slot=60000), Drop.BAD_SLOT),
    ]


@pytest.mark.smoke
def test_bad_packets_are_dropped_counted_and_never_touch_a_register(sw):
    add_job(sw, job_id=3, index=1, bits=8, workers=WORKERS[2:], base=0, count=2)
    job = add_job(sw, job_id=7, index=0, bits=4, base=2, count=6)
    rng = np.random.default_rng(6)
    words = [job.fmt.pack(rng.integers(-7, 8, sw.words * job.fmt.lanes)) for _ in range(4)]
    send(sw, job, 0, words[0], slot=4)  # leave a slot half-aggregated
    # The registers are read once the switch has taken it (a busy switch may not yet).
    assert count(sw, "agg_packets", 0, 1, timeout=10.0) == 1
    before = sw.registers()
    cases = bad_packets(job, sw.words)
    expected = {}
    for name, frame, reason, *port in cases:
        sw.hosts[port[0] if port else 1].send(frame)
        expected[reason] = expected.get(reason, 0) + 1
    assert all(results(sw, port, timeout=0.3) == [] for port in range(1, 6))
    deadline = time.monotonic() + 10  # a busy switch may still be dropping the last ones
    while True:
        drops = sw.counters("drops")
        got = {r: drops.get(r, (0, 0))[0] for r in expected}
        if got == expected or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert got == expected
    after = sw.registers()
    for name in before:
        assert before[name] == after[name], f"register {name} changed"
    assert count(sw, "agg_packets", 0, 1) == 1
    # The half-aggregated slot is intact: completing it gives the exact sum.
    for k in (1, 2, 3):
        send(sw, job, k, words[k], slot=4)
    got = results(sw, 1, count=1)
    assert len(got) == 1
    check_result(got[0], job, job.workers[0], wrapping_sum(words))


def test_plain_ipv4_is_forwarded_by_lpm(sw):
    w0 = WORKERS[0]
    pkt = (Ether(src=mac(w0.mac), dst="02:00:00:00:00:05") / IP(src=int_to_ip(w0.ip), dst=OTHER_IP)
           / UDP(sport=1234, dport=5678) / b"hello over the fabric")
    sw.hosts[1].send(pkt)
    got = results(sw, 5, count=1)
    assert len(got) == 1
    out = got[0]
    assert out[IP].ttl == pkt[IP].ttl - 1
    assert bytes(out[UDP].payload) == b"hello over the fabric"
    assert ipv4_checksum_ok(out)
    # A result travelling through a transit switch is routed there, once the control
    # plane declared its aggregator upstream of the port it comes in on.
    transit = (Ether(src=AGG_MAC, dst=mac(WORKERS[2].mac)) / IP(src=AGG_IP, dst="10.0.0.3")
               / UDP(sport=QAINA_UDP_PORT, dport=QAINA_UDP_PORT)
               / QAINA(job_id=7, worker=2, flags=FLAG_RESULT, words=list(range(sw.words))))
    sw.hosts[5].send(transit)
    assert results(sw, 3, timeout=0.3) == []
    assert count(sw, "drops", Drop.FORGED_RESULT, 1) == 1
    sw.conn.insert_many([result_entry(5, ip_to_int(AGG_IP))])
    sw.hosts[5].send(transit)
    got = results(sw, 3, count=1)
    assert len(got) == 1 and list(got[0][QAINA].words) == list(range(sw.words))
    # No route: dropped and counted.
    sw.hosts[1].send(Ether() / IP(src=int_to_ip(w0.ip), dst="10.9.9.9") / UDP())
    assert all(results(sw, port, timeout=0.3) == [] for port in range(1, 6))
    assert count(sw, "drops", Drop.NO_ROUTE, 1) == 1


def test_entries_with_noaction_are_hits_that_admit_no_worker(sw):
    """job_table / member_table entries with NoAction hit, leaving metadata at zero:
    a job without workers, a member with index 0 bound to port 0 (no port here)."""
    job = add_job(sw, job_id=7)
    w0 = job.workers[0]
    sw.conn.insert("MyIngress.job_table", {"hdr.qaina.job_id": 8}, "NoAction")
    sw.conn.insert("MyIngress.member_table", {"hdr.qaina.job_id": 8, "hdr.ipv4.srcAddr": w0.ip},
                   "MyIngress.set_member", {"worker": 0, "port": w0.port})
    sw.conn.insert("MyIngress.member_table",
                   {"hdr.qaina.job_id": 7, "hdr.ipv4.srcAddr": ip_to_int("10.0.0.99")},
                   "NoAction")
    sw.hosts[1].send(contribution(w0, 8, range(sw.words)))  # job 8 hits with n = 0: bad worker
    sw.hosts[1].send(contribution(w0, 7, range(sw.words), worker=0, src_ip="10.0.0.99"))
    assert all(results(sw, port, timeout=0.3) == [] for port in range(1, 6))
    drops = sw.counters("drops")
    assert drops[Drop.BAD_WORKER][0] == 1
    assert drops[Drop.WRONG_PORT][0] == 1  # the NoAction member's port is 0
    assert drops[Drop.UNKNOWN_JOB][0] == 0 and drops[Drop.NON_MEMBER][0] == 0
    assert count(sw, "agg_packets", 0, 0) == 0


def test_a_member_address_from_another_port_cannot_touch_the_job(sw):
    """A host on port 3 claiming worker 0's address: its contribution is not added, it
    cannot pull the stored result of a completed slot, and it cannot stall the
    slot's other copy."""
    job = add_job(sw)
    w0 = job.workers[0]
    rng = np.random.default_rng(8)
    forged = job.fmt.pack(rng.integers(-7, 8, sw.words * job.fmt.lanes))
    sw.hosts[3].send(contribution(w0, job.job_id, forged, slot=0))
    _, words = one_round(sw, job, rng, slot=0)
    for w in job.workers:
        got = results(sw, w.port, count=1)
        assert len(got) == 1
        check_result(got[0], job, w, wrapping_sum(words))
    sw.hosts[3].send(contribution(w0, job.job_id, words[0], slot=0, flags=FLAG_RETX))
    sw.hosts[3].send(contribution(w0, job.job_id, forged, slot=0, ver=1))
    assert results(sw, 3, timeout=0.3) == []
    _, words = one_round(sw, job, rng, slot=0, ver=1, seq=1)
    for w in job.workers:
        got = results(sw, w.port, count=1)
        assert len(got) == 1
        check_result(got[0], job, w, wrapping_sum(words), seq=1)
    assert count(sw, "drops", Drop.WRONG_PORT, 3) == 3
    assert count(sw, "agg_packets", 0, 8) == 8


@pytest.mark.parametrize("field,value,member_index", [("job_index", 200, 0),
                                                     ("n_workers", 40, 35)])
def test_job_entries_out_of_range_drop_their_packets(sw, field, value, member_index):
    """Any value the P4Info allows may be written; a job whose counter index or worker
    count the program cannot hold drops its packets (bad_job) and nothing breaks."""
    w0 = WORKERS[0]
    params = dict(job_index=0, n_workers=4, slot_base=0, slot_count=8, mcast_grp=1, bits=4,
                  lane_width=6, lanes=5, shared=0)
    params[field] = value
    sw.conn.insert("MyIngress.job_table", {"hdr.qaina.job_id": 5}, "MyIngress.set_job", params)
    sw.conn.insert("MyIngress.member_table", {"hdr.qaina.job_id": 5, "hdr.ipv4.srcAddr": w0.ip},
                   "MyIngress.set_member", {"worker": member_index, "port": w0.port})
    before = sw.registers()
    sw.hosts[1].send(contribution(w0, 5, range(sw.words), worker=member_index))
    sw.hosts[1].send(contribution(w0, 5, range(sw.words), worker=member_index, src_ip="10.0.0.99"))
    assert all(results(sw, port, timeout=0.3) == [] for port in range(1, 6))
    assert count(sw, "drops", Drop.BAD_JOB, 2) == 2
    assert sw.registers() == before
    # The switch goes on aggregating for a job in range.
    job = add_job(sw, job_id=7, index=1)
    _, words = one_round(sw, job, np.random.default_rng(9), slot=1)
    for w in job.workers:
        got = results(sw, w.port, count=1)
        assert len(got) == 1
        check_result(got[0], job, w, wrapping_sum(words))


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
    got = results(sw, 1, count=1)
    assert len(got) == 1
    check_result(got[0], job, w0, wrapping_sum(words))
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


# -- the shared allocation (ATP-style): claims, collisions, the fallback host ------------

FALLBACK_IP, FALLBACK_MAC = "10.0.1.9", "02:00:00:00:01:09"


def shared_job(lab, job_id=7, index=0, workers=WORKERS, base=0, count=8) -> Job:
    """A job of the shared allocation over slots ``base .. base + count - 1``; its
    fallback host is behind port 5."""
    job = Job(job_id, index, LaneFormat(4, len(workers)), base, count,
              [Worker(k, w.ip, w.mac, w.port) for k, w in enumerate(workers)],
              Upstream(5, ip_to_int(FALLBACK_IP), mac_to_int(FALLBACK_MAC), FALLBACK_WORKER),
              shared=True)
    program_job(lab.conn, job)
    return job


def fallback_result(job: Job, words, slot=0, ver=0, seq=0, exp=0, flags=FLAG_RESULT):
    """The fallback host's result for a chunk of ``job`` (or, with FLAG_FLUSH, its
    request for a partial sum)."""
    return (Ether(src=FALLBACK_MAC, dst=AGG_MAC) / IP(src=FALLBACK_IP, dst=AGG_IP)
            / UDP(sport=QAINA_UDP_PORT, dport=QAINA_UDP_PORT)
            / QAINA(job_id=job.job_id, worker=FALLBACK_WORKER, flags=flags, slot=slot,
                    ver=ver, exp=exp, seq=seq, words=[int(x) for x in words]))


def flush_request(lab, job: Job, have: int, slot: int, seq: int):
    """The fallback host asks for the partial sum of the workers not in ``have``."""
    words = [have] + [0] * (lab.words - 1)
    return fallback_result(job, words, slot=slot, seq=seq, flags=FLAG_RESULT | FLAG_FLUSH)


def test_shared_flush_answers_the_partial_that_completes_the_hosts_singles(sw):
    """A split chunk: worker 0 collided, workers 1..3 claimed the copy later. The
    fallback host's request with its singles' workers gets the other workers' partial
    sum (worker FALLBACK_PARTIAL) and frees the copy, only when the two sets are
    disjoint and make the whole job; any other request is dropped, nothing touched."""
    rng = np.random.default_rng(27)
    job = shared_job(sw)
    words = random_words(sw, job, rng, 4)
    for k in (1, 2):
        send(sw, job, k, words[k], slot=4, seq=30, exp=k)
    before = sw.registers()
    for have in (0b0001, 0b0011, 0b1011):  # incomplete, overlapping, overlapping
        sw.hosts[5].send(flush_request(sw, job, have, slot=4, seq=30))
    sw.hosts[5].send(flush_request(sw, job, 0b1001, slot=4, seq=31))  # another chunk
    got = results(sw, 5, timeout=0.3)
    assert got == [], [(g[QAINA].worker, g[QAINA].flags, g[QAINA].seq) for g in got]
    assert count(sw, "drops", Drop.STALE_RESULT, 4) == 4
    assert sw.registers() == before
    send(sw, job, 3, words[3], slot=4, seq=30, exp=-1)
    sw.hosts[5].send(flush_request(sw, job, 0b0001, slot=4, seq=30))
    check_to_fallback(one_to_fallback(sw), job, FALLBACK_PARTIAL, 0,
                      wrapping_sum(words[1:]), seq=30, exp=2)
    regs = sw.registers()
    assert regs["MyIngress.agg_seen"][4] == 0 and regs["MyIngress.agg_count"][4] == 0
    assert [count(sw, c, 0, 1) for c in ("slots_opened", "slots_closed")] == [1, 1]
    # Given up: a late retransmission goes on as a single, and the copy is free to claim.
    sw.hosts[5].send(flush_request(sw, job, 0b0001, slot=4, seq=30))
    assert results(sw, 5, timeout=0.3) == []
    send(sw, job, 0, words[0], slot=4, seq=32)
    assert count(sw, "slots_opened", 0, 2) == 2


def check_to_fallback(pkt, job: Job, worker: int, flags: int, words, seq: int, exp=None):
    """``pkt`` went from this switch to ``job``'s fallback host."""
    q = pkt[QAINA]
    assert (q.job_id, q.worker, int(q.flags), q.seq) == (job.job_id, worker, flags, seq)
    assert pkt[Ether].src == AGG_MAC and pkt[Ether].dst == FALLBACK_MAC
    assert pkt[IP].src == AGG_IP and pkt[IP].dst == FALLBACK_IP
    assert pkt[IP].ttl == 64 and pkt[UDP].chksum == 0 and ipv4_checksum_ok(pkt)
    assert list(q.words) == [int(x) for x in words]
    if exp is not None:
        assert q.exp == exp


def random_words(lab, job: Job, rng, n: int):
    return [job.fmt.pack(rng.integers(-7, 8, lab.words * job.fmt.lanes)) for _ in range(n)]


def one_to_fallback(lab) -> list:
    got = results(lab, 5, count=1)
    assert len(got) == 1, f"{len(got)} packets to the fallback host"
    return got[0]


def test_shared_use_claims_a_free_copy_and_holds_it_until_the_fallback_result(sw):
    """A complete use goes to the fallback host (worker 255) and holds its copy: another
    job's contribution there collides, a retransmission sends the sum again, until the
    fallback host's result releases the copy; then the stored result answers a
    retransmission, and the other job claims the copy."""
    rng = np.random.default_rng(21)
    job_a = shared_job(sw, job_id=7, index=0)
    job_b = shared_job(sw, job_id=9, index=1, workers=WORKERS[2:])
    words = random_words(sw, job_a, rng, 4)
    for k in range(4):
        send(sw, job_a, k, words[k], slot=3, exp=k - 2, seq=11)
    check_to_fallback(one_to_fallback(sw), job_a, FALLBACK_WORKER, 0, wrapping_sum(words),
                      seq=11, exp=1)
    assert all(results(sw, w.port, timeout=0.2) == [] for w in job_a.workers)
    assert [count(sw, c, 0, 1) for c in ("slots_opened", "slots_closed")] == [1, 1]
    assert count(sw, "agg_packets", 0, 4) == 4
    # Held: job 9's chunk collides, and goes on as a single.
    other = random_words(sw, job_b, rng, 2)
    before = sw.registers()
    send(sw, job_b, 0, other[0], slot=3, seq=11)
    check_to_fallback(one_to_fallback(sw), job_b, 0, FLAG_FALLBACK, other[0], seq=11)
    assert count(sw, "fallback_packets", 1, 1) == 1
    assert sw.registers() == before
    # A retransmission before the result: the sum goes to the fallback host again.
    send(sw, job_a, 2, words[2], slot=3, seq=11, flags=FLAG_RETX)
    check_to_fallback(one_to_fallback(sw), job_a, FALLBACK_WORKER, FLAG_RETX,
                      wrapping_sum(words), seq=11, exp=1)
    # The fallback host's result releases the copy and goes to every worker.
    final = wrapping_sum(words + other[:1])
    sw.hosts[5].send(fallback_result(job_a, final, slot=3, seq=11, exp=4))
    for w in job_a.workers:
        got = results(sw, w.port, count=1)
        assert len(got) == 1
        check_result(got[0], job_a, w, final, exp=4, seq=11)
    send(sw, job_a, 1, words[1], slot=3, seq=11, flags=FLAG_RETX)
    got = results(sw, 2, count=1)
    assert len(got) == 1
    check_result(got[0], job_a, job_a.workers[1], final, exp=4, seq=11,
                 flags=FLAG_RESULT | FLAG_RETX)
    assert count(sw, "retx_answered", 0, 1) == 1
    # Released: job 9 claims the copy, and its use completes with its own words only.
    send(sw, job_b, 0, other[0], slot=3, seq=11)
    send(sw, job_b, 1, other[1], slot=3, seq=11)
    check_to_fallback(one_to_fallback(sw), job_b, FALLBACK_WORKER, 0, wrapping_sum(other),
                      seq=11)
    assert count(sw, "slots_opened", 1, 1) == 1
    assert count(sw, "fallback_packets", 1, 1) == 1
    assert count(sw, "fallback_packets", 0, 0) == 0
    assert results(sw, 5, timeout=0.2) == []


def test_shared_collision_with_an_open_use_goes_to_the_fallback_untouched(sw):
    """Another job's chunk, or another chunk of the same job, on a copy an open use
    holds: FLAG_FALLBACK, worker kept, no register touched; the open use completes
    exactly."""
    rng = np.random.default_rng(22)
    job_a = shared_job(sw, job_id=7, index=0)
    job_b = shared_job(sw, job_id=9, index=1, workers=WORKERS[2:])
    words = random_words(sw, job_a, rng, 4)
    for k in (0, 1):
        send(sw, job_a, k, words[k], slot=5, ver=1, seq=40)
    assert count(sw, "agg_packets", 0, 2, timeout=10.0) == 2
    before = sw.registers()
    other = random_words(sw, job_b, rng, 1)[0]
    send(sw, job_b, 1, other, slot=5, ver=1, seq=40, exp=3)
    check_to_fallback(one_to_fallback(sw), job_b, 1, FLAG_FALLBACK, other, seq=40, exp=3)
    send(sw, job_a, 2, words[2], slot=5, ver=1, seq=41)  # the job's next chunk
    check_to_fallback(one_to_fallback(sw), job_a, 2, FLAG_FALLBACK, words[2], seq=41)
    assert count(sw, "fallback_packets", 1, 1) == 1
    assert count(sw, "fallback_packets", 0, 1) == 1
    assert sw.registers() == before
    assert count(sw, "agg_packets", 1, 0) == 0
    for k in (2, 3):
        send(sw, job_a, k, words[k], slot=5, ver=1, seq=40)
    check_to_fallback(one_to_fallback(sw), job_a, FALLBACK_WORKER, 0, wrapping_sum(words),
                      seq=40)
    assert all(results(sw, port, timeout=0.2) == [] for port in range(1, 5))


def test_shared_result_for_a_chunk_no_copy_holds_goes_down_untouched(sw):
    """The fallback host aggregated a chunk itself: its result is multicast to the job's
    workers, whether the copy is free or another job's, and no register changes."""
    rng = np.random.default_rng(23)
    job_a = shared_job(sw, job_id=7, index=0)
    job_b = shared_job(sw, job_id=9, index=1, workers=WORKERS[2:])
    send(sw, job_b, 0, random_words(sw, job_b, rng, 1)[0], slot=4, seq=2)
    assert count(sw, "agg_packets", 1, 1, timeout=10.0) == 1
    before = sw.registers()
    for slot in (2, 4):  # a free copy; job 9's open use
        final = wrapping_sum(random_words(sw, job_a, rng, 4))
        sw.hosts[5].send(fallback_result(job_a, final, slot=slot, seq=2, exp=-1))
        for w in job_a.workers:
            got = results(sw, w.port, count=1)
            assert len(got) == 1, f"slot {slot}, worker {w.index}"
            check_result(got[0], job_a, w, final, exp=-1, seq=2)
    assert count(sw, "results_sent", 0, 8) == 8
    assert sw.registers() == before
    assert count(sw, "drops", Drop.STALE_RESULT, 0) == 0


def test_shared_retransmission_gives_up_an_open_use_and_never_claims(sw):
    """A worker's retransmission into the open use it is part of frees the copy and goes
    on as a single (FLAG_FALLBACK | FLAG_RETX); a retransmission never claims a free
    copy; a repeat without RETX is a duplicate as before."""
    rng = np.random.default_rng(24)
    job = shared_job(sw)
    words = random_words(sw, job, rng, 4)
    for k in (0, 1):
        send(sw, job, k, words[k], slot=6, seq=7)
    send(sw, job, 1, words[1], slot=6, seq=7)  # a repeat, no RETX
    assert count(sw, "drops", Drop.DUPLICATE, 1) == 1
    send(sw, job, 0, words[0], slot=6, seq=7, flags=FLAG_RETX)
    check_to_fallback(one_to_fallback(sw), job, 0, FLAG_FALLBACK | FLAG_RETX, words[0], seq=7)
    assert count(sw, "fallback_packets", 0, 0) == 0
    regs = sw.registers()
    assert regs["MyIngress.agg_seen"][6] == 0 and regs["MyIngress.agg_count"][6] == 0
    assert count(sw, "slots_closed", 0, 1) == 1  # the use left the switch: not in use
    # The copy is free now, but a retransmission does not claim it.
    send(sw, job, 2, words[2], slot=6, seq=7, flags=FLAG_RETX)
    check_to_fallback(one_to_fallback(sw), job, 2, FLAG_FALLBACK | FLAG_RETX, words[2], seq=7)
    assert count(sw, "fallback_packets", 0, 1) == 1
    assert sw.registers() == regs
    assert count(sw, "slots_opened", 0, 1) == 1


def test_shared_jobs_never_clear_the_shadow_copy(sw):
    """A shared contribution to one copy of a slot leaves the other copy's use (another
    job's, or the job's own) as it was."""
    rng = np.random.default_rng(25)
    job_a = shared_job(sw, job_id=7, index=0)
    job_b = shared_job(sw, job_id=9, index=1, workers=WORKERS[2:])
    other = random_words(sw, job_b, rng, 2)
    send(sw, job_b, 0, other[0], slot=1, ver=1, seq=3)  # job 9 opens copy 1 of slot 1
    words = random_words(sw, job_a, rng, 4)
    for k in range(4):  # job 7 worker 0 (same index as job 9's worker 0) on copy 0
        send(sw, job_a, k, words[k], slot=1, ver=0, seq=3)
    check_to_fallback(one_to_fallback(sw), job_a, FALLBACK_WORKER, 0, wrapping_sum(words),
                      seq=3)
    seen = sw.registers()["MyIngress.agg_seen"]
    assert seen[POOL_SLOTS + 1] == 0b1 and seen[1] == 0b1111
    send(sw, job_a, 0, words[0], slot=1, ver=1, seq=4)  # job 7's next use: copy 1, collides
    check_to_fallback(one_to_fallback(sw), job_a, 0, FLAG_FALLBACK, words[0], seq=4)
    assert sw.registers()["MyIngress.agg_seen"][1] == 0b1111
    send(sw, job_b, 1, other[1], slot=1, ver=1, seq=3)
    check_to_fallback(one_to_fallback(sw), job_b, FALLBACK_WORKER, 0, wrapping_sum(other),
                      seq=3)


def test_release_job_frees_a_shared_jobs_copies(sw):
    """A shared job that leaves with one use open and one complete (waiting for the
    fallback host's result) holds no copy afterwards: the next job claims both, and
    another job's copies are left alone."""
    rng = np.random.default_rng(26)
    job_a = shared_job(sw, job_id=7, index=0)
    job_c = shared_job(sw, job_id=5, index=2, workers=WORKERS[:2])
    send(sw, job_c, 0, random_words(sw, job_c, rng, 1)[0], slot=7, seq=1)
    words = random_words(sw, job_a, rng, 4)
    for k in (0, 1):
        send(sw, job_a, k, words[k], slot=3, seq=8)
    for k in range(4):
        send(sw, job_a, k, words[k], slot=4, seq=9)
    one_to_fallback(sw)
    assert count(sw, "agg_packets", 0, 6, timeout=10.0) == 6
    release_job(sw.conn, job_a, registers=sw.target.registers(sw.conn))
    regs = sw.registers()
    for copy in (3, 4):
        assert regs["MyIngress.agg_seen"][copy] == 0 and regs["MyIngress.agg_count"][copy] == 0
    assert regs["MyIngress.agg_seen"][7] == 0b1 and regs["MyIngress.agg_count"][7] == 1
    job_b = shared_job(sw, job_id=9, index=1, workers=WORKERS[2:])
    for slot, seq in ((3, 8), (4, 9)):
        other = random_words(sw, job_b, rng, 2)
        for k in (0, 1):
            send(sw, job_b, k, other[k], slot=slot, seq=seq)
        check_to_fallback(one_to_fallback(sw), job_b, FALLBACK_WORKER, 0, wrapping_sum(other),
                          seq=seq)
    assert count(sw, "slots_opened", 1, 2) == 2
    assert count(sw, "fallback_packets", 1, 0) == 0
