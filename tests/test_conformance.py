"""Conformance suite of the QAINA pipeline: packets in, packets out, counters.

Every case runs against each target of the ``lab`` fixture (``conformance_lab.py``):
the embedded switch everywhere, BMv2 ``simple_switch_grpc`` where it is installed,
each with every build of qaina.p4 (32 payload words, and the 64-, 128- and 256-word
ones). The switch is a real process on real veth pairs, programmed over P4Runtime by
the harness's control plane. This part: aggregation, the two-level hierarchy, bad
packets, forwarding and the job entries' checks.
"""

from __future__ import annotations

import random
import struct
import time

import numpy as np
import pytest
from scapy.layers.inet import IP, TCP, UDP
from scapy.layers.l2 import ARP, Ether

from qaina_bench.harness.switches.jobs import (Job, Upstream, Worker, aggregator_ip, aggregator_mac,
                                      int_to_ip, ip_to_int, mac_to_int, program_job, release_job,
                                      result_entry)
from qaina_bench.hosts.lanes import LaneFormat
from qaina_bench.p4.constants import Drop
from qaina_bench.p4.header import FLAG_RESULT, FLAG_RETX, QAINA_UDP_PORT

# lab and sw are the suite's fixtures
from conformance_lab import (AGG_IP, AGG_MAC, OTHER_IP, QAINA, WORKERS, add_job, check_result, contribution, count, ipv4_checksum_ok, lab, mac, one_round, results, send, sw, wrapping_sum)


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
    for _ in range(3):  # BMv2 can lose a frame on capture on a busy machine: again, then
        send(sw, job, 0, words[0], flags=FLAG_RETX)
        if count(sw, "drops", Drop.DUPLICATE, 1, timeout=5.0) == 1:
            break
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
            got = results(sw, w.port, count=1)
            got += results(sw, w.port, timeout=0.3)  # no second result follows
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
    stale = count(sw, "drops", Drop.STALE_RESULT, 0, timeout=0)
    bad = count(sw, "drops", Drop.BAD_FLAGS, 0, timeout=0)
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

    def transits(frames):  # not a late frame of an earlier test on the same lab
        return [f for f in frames if QAINA in f and f[QAINA].slot == transit[QAINA].slot
                and list(f[QAINA].words) == list(transit[QAINA].words)]
    assert transits(results(sw, 3, timeout=0.3)) == []
    assert count(sw, "drops", Drop.FORGED_RESULT, 1) == 1
    sw.conn.insert_many([result_entry(5, ip_to_int(AGG_IP))])
    sw.hosts[5].send(transit)
    got = results(sw, 3, count=1)
    assert len(got) == 1 and list(got[0][QAINA].words) == list(range(sw.words))
    # No route: dropped and counted (only that packet is looked for: a late frame of an
    # earlier test may still arrive on a busy machine).
    sw.hosts[1].send(Ether() / IP(src=int_to_ip(w0.ip), dst="10.9.9.9") / UDP())
    assert not any(IP in f and f[IP].dst == "10.9.9.9"
                   for port in range(1, 6) for f in results(sw, port, timeout=0.3))
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


def test_a_default_action_written_over_p4runtime_is_what_a_miss_runs(sw):
    """``upstream_table``, ``result_rewrite`` and ``source_guard`` act on a miss by
    their default action (the program looks at ``hit`` only for admission): a job
    without an upstream entry sends its sum up the default's way, a copy without a
    rewrite entry is addressed by the default, and a RESULT from a source no entry
    lists gets the default's ``results_in``."""
    rng = np.random.default_rng(32)
    job = add_job(sw)
    spare = Worker(3, ip_to_int("10.0.1.7"), mac_to_int("02:00:00:00:01:07"), 4)
    sw.conn.delete("MyEgress.result_rewrite", {"standard_metadata.egress_rid": job.rid(3)},
                   "MyEgress.to_worker", {"mac": 0, "ip": 0, "worker": 0})
    sw.conn.set_default("MyEgress.result_rewrite", "MyEgress.to_worker",
                        {"mac": spare.mac, "ip": spare.ip, "worker": 3})
    _, words = one_round(sw, job, rng, slot=1, seq=3)
    for w in job.workers:
        got = results(sw, w.port, count=1)
        assert len(got) == 1
        check_result(got[0], job, spare if w.index == 3 else w, wrapping_sum(words), seq=3)
    # Every job without an entry goes up to the default's aggregator.
    up = Upstream(5, ip_to_int("10.0.1.9"), mac_to_int("02:00:00:00:01:09"), 6)
    sw.conn.set_default("MyIngress.upstream_table", "MyIngress.set_upstream",
                        {"port": up.port, "addr": up.ip, "mac": up.mac, "worker": up.worker})
    _, words = one_round(sw, job, rng, slot=2, seq=4)
    got = results(sw, 5, count=1)
    assert len(got) == 1 and got[0][IP].dst == "10.0.1.9" and got[0][QAINA].worker == 6
    assert list(got[0][QAINA].words) == [int(x) for x in wrapping_sum(words)]
    assert all(results(sw, w.port, timeout=0.3) == [] for w in job.workers)
    # A RESULT from an unlisted source on an unguarded port: forged while the default
    # leaves results_in at 0, routed once it sets 1.
    frame = (Ether(src=AGG_MAC, dst="02:00:00:00:00:01") / IP(src=OTHER_IP, dst="10.0.0.1")
             / UDP(sport=QAINA_UDP_PORT, dport=QAINA_UDP_PORT)
             / QAINA(job_id=7, worker=0, flags=FLAG_RESULT, words=[5] * sw.words))
    sw.hosts[5].send(frame)
    assert count(sw, "drops", Drop.FORGED_RESULT, 1) == 1
    sw.conn.set_default("MyIngress.source_guard", "MyIngress.allow_source", {"results": 1})
    sw.hosts[5].send(frame)
    got = results(sw, 1, count=1)
    assert len(got) == 1 and got[0][QAINA].flags == FLAG_RESULT
    assert count(sw, "drops", Drop.FORGED_RESULT, 1, timeout=0.3) == 1


def with_checksum(pkt, target: int):
    """``pkt`` with its IPv4 id chosen so that its header checksum is ``target``."""
    pkt = Ether(bytes(pkt))  # ihl and the lengths filled in
    header = bytearray(bytes(pkt[IP])[:pkt[IP].ihl * 4])
    header[4:6] = header[10:12] = b"\0\0"
    s = sum(struct.unpack(f"!{len(header) // 2}H", header))
    s = (s & 0xFFFF) + (s >> 16)
    pkt[IP].id = ((~target & 0xFFFF) - s) % 0xFFFF  # one's complement: it sums to ~target
    del pkt[IP].chksum
    pkt = Ether(bytes(pkt))
    assert pkt[IP].chksum == target
    return pkt


def test_routing_drops_an_expiring_ttl_and_keeps_options_with_a_valid_checksum(sw):
    """A packet to be routed with a TTL of 0 or 1 is dropped (a loop cannot keep it
    going); one with IPv4 options keeps them, its checksum updated for the TTL's
    decrement, also where the update folds to zero."""
    from scapy.layers.inet import IPOption_Router_Alert
    w0 = WORKERS[0]

    def frame(tag: int, **ip):
        return (Ether(src=mac(w0.mac), dst="02:00:00:00:00:05")
                / IP(src=int_to_ip(w0.ip), dst=OTHER_IP, **ip)
                / UDP(sport=1234, dport=5678) / struct.pack("!I", tag))

    for ttl in (0, 1):
        sw.hosts[1].send(frame(ttl, ttl=ttl))
    assert count(sw, "drops", Drop.TTL_EXPIRED, 2) == 2
    alert = [IPOption_Router_Alert()]
    sent = [frame(2, ttl=2), frame(3, ttl=2, options=alert), frame(4, ttl=255, options=alert),
            with_checksum(frame(5, ttl=64, options=alert), 0xFEFF),
            with_checksum(frame(6, ttl=64, options=alert), 0x0100)]
    for pkt in sent:
        sw.hosts[1].send(pkt)
    got = [f for f in results(sw, 5, count=len(sent)) if UDP in f]
    assert [bytes(f[UDP].payload)[:4] for f in got] == [bytes(p[UDP].payload) for p in sent]
    for out, pkt in zip(got, sent):
        assert out[IP].ttl == pkt[IP].ttl - 1 and out[IP].options == pkt[IP].options
        recomputed = out[IP].copy()
        del recomputed.chksum  # what a full recomputation gives, 0x0000 where it folds
        assert out[IP].chksum == IP(bytes(recomputed)).chksum and ipv4_checksum_ok(out)
    assert count(sw, "drops", Drop.TTL_EXPIRED, 2, timeout=0.3) == 2


def test_a_counter_set_near_its_limit_counts_on_and_the_switch_goes_on(sw):
    """A counter MODIFY may set any non-negative int64 (spec, "Counter Entry"); a
    packet counted on from 2**63 - 1 wraps it as a uint64 (what BMv2 keeps, read back
    as an int64) and the switch goes on forwarding."""
    from qaina_bench.p4.proto import p4runtime_pb2
    u = p4runtime_pb2.Update(type=p4runtime_pb2.Update.MODIFY)
    u.entity.counter_entry.counter_id = sw.conn.p4info.counter("MyIngress.drops").id
    u.entity.counter_entry.index.index = Drop.NOT_IPV4
    u.entity.counter_entry.data.packet_count = 2**63 - 1
    u.entity.counter_entry.data.byte_count = 2**63 - 1000
    sw.conn._write("counter", [u])
    junk = bytes(12) + b"\x88\xb5" + bytes(50)
    sw.hosts[1].send(junk)
    deadline = time.monotonic() + 10
    while sw.counters("drops")[Drop.NOT_IPV4][0] == 2**63 - 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sw.counters("drops")[Drop.NOT_IPV4] == (-2**63, 2**63 - 1000 + len(junk))
    w0 = WORKERS[0]
    pkt = (Ether(src=mac(w0.mac), dst="02:00:00:00:00:05") / IP(src=int_to_ip(w0.ip),
                                                                 dst=OTHER_IP) / UDP() / b"on")
    sw.hosts[1].send(pkt)
    assert [bytes(f[UDP].payload) for f in results(sw, 5, count=1)] == [b"on"]
