"""Conformance suite, the shared allocation (ATP-style): claims, collisions, the
fallback host, flushes and freeing (see ``test_conformance.py`` for the targets).
"""

from __future__ import annotations

import numpy as np
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether

from qaina_bench.harness.switches.jobs import (Job, Upstream, Worker, ip_to_int, job_entries,
                                               mac_to_int, program_job, release_job)
from qaina_bench.hosts.lanes import LaneFormat
from qaina_bench.p4.constants import POOL_SLOTS, Drop
from qaina_bench.p4.header import (FALLBACK_PARTIAL, FALLBACK_WORKER, FLAG_FALLBACK, FLAG_FLUSH,
                                   FLAG_RESULT, FLAG_RETX, QAINA_UDP_PORT)

# lab and sw are the suite's fixtures
from conformance_lab import (AGG_IP, AGG_MAC, QAINA, WORKERS, check_result, count,
                             ipv4_checksum_ok, lab, results, send, sw, wrapping_sum)


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
    assert count(sw, "agg_packets", 0, 2) == 2  # both applied before the snapshot
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


def test_shared_job_without_an_upstream_entry_sends_to_port_zero(sw):
    """A shared job written with no ``upstream_table`` entry: the program's
    metadata stays zero, so a complete use and a collision go out of port 0, which
    this switch does not have; counted like any other, never an internal error."""
    rng = np.random.default_rng(29)
    job = Job(7, 0, LaneFormat(4, 2), 0, 8,
              [Worker(k, w.ip, w.mac, w.port) for k, w in enumerate(WORKERS[:2])],
              shared=True)
    sw.conn.insert_many(job_entries(job))  # what program_job refuses to write
    sw.conn.set_multicast_group(job.mcast_grp, [(w.port, job.rid(w.index))
                                                for w in job.workers])
    words = random_words(sw, job, rng, 3)
    for k in (0, 1):
        send(sw, job, k, words[k], slot=2, seq=5)
    send(sw, job, 0, words[2], slot=2, seq=6)  # held by the first chunk: a collision
    assert [count(sw, c, 0, 1) for c in ("slots_opened", "slots_closed",
                                         "fallback_packets")] == [1, 1, 1]
    assert count(sw, "agg_packets", 0, 2) == 2
    assert all(results(sw, port, timeout=0.3) == [] for port in range(1, 6))
    assert count(sw, "drops", Drop.INTERNAL, 0, timeout=0.5) == 0
