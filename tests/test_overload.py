"""An overloaded embedded switch sheds whole slot uses, never part of one.

Functional, not timed: the shed level is set by hand for each burst (the receive
loop sets it from how far its rings are behind), in the pipeline and in a live
switch that is stopped (SIGSTOP) while its rings fill. Every slot use must end
either aggregated, with the exact sum sent to every worker, or shed whole (no
contribution counted: nothing stranded), and a shed use must complete from its
workers' retransmissions, as an agent sends them.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from qaina_bench.harness.benchmarks import bench
from qaina_bench.harness.switches.jobs import Job, Worker
from qaina_bench.hosts.lanes import LaneFormat
from qaina_bench.p4.embedded import pipeline as pl
from qaina_bench.p4.constants import Drop
from qaina_bench.p4.embedded.burst import SHED_FULL
from qaina_bench.p4.header import FLAG_RESULT, FLAG_RETX, PAYLOAD_OFFSET, QAINA_AT

from test_pipeline_burst import make_pipeline

WORKERS = 4
SLOT_AT, VER_AT, FLAGS_AT = QAINA_AT["slot"], QAINA_AT["ver"], QAINA_AT["flags"]


def make_job(slots: int = bench.BENCH_SLOTS) -> Job:
    return Job(1, 0, LaneFormat(4, WORKERS), 0, slots,
               [Worker(k, 0x0A000001 + k, 0x020000000001 + k, k + 1) for k in range(WORKERS)])


def use_of(frame: bytes) -> tuple[int, int]:
    return int.from_bytes(frame[SLOT_AT:SLOT_AT + 2], "big"), frame[VER_AT]


def payload(frame: bytes) -> np.ndarray:
    return np.frombuffer(frame[PAYLOAD_OFFSET:], ">u4").astype(np.uint32)


def expected_sums(frames) -> dict:
    sums: dict[tuple[int, int], np.ndarray] = {}
    for _, f in frames:
        key = use_of(f)
        sums[key] = sums.get(key, 0) + payload(f)
    return sums


class Feeder:
    """Bursts of frames from one port into ``process_burst``, as the ports hand them."""

    def __init__(self, p, size: int = 256):
        self.p = p
        self.store = bytearray(size * 2052)
        self.slots = [pl.frame_slot(self.store, i * 2052 + pl.SLOT_ALIGN_OFFSET, 2048)
                      for i in range(size)]
        self.rows = np.ndarray((size, 2048), np.uint8, buffer=self.store,
                               offset=pl.SLOT_ALIGN_OFFSET, strides=(2052, 1))

    def burst(self, port: int, frames: list[bytes], level: int):
        for n, f in enumerate(frames):
            self.slots[n][0][:len(f)] = f
        self.p.process_burst(port, self.slots[:len(frames)], [len(f) for f in frames],
                             self.rows[:len(frames)], level)


def results(out) -> dict:
    """{(slot, ver): {port: payload}} of the results the switch sent."""
    got: dict[tuple[int, int], dict] = {}
    for port, f in out:
        assert f[FLAGS_AT] & FLAG_RESULT
        got.setdefault(use_of(f), {})[port] = payload(f)
    return got


def check_whole(p, job, frames, out) -> set:
    """Every use aggregated exactly and sent to all workers, or shed whole; returns
    the shed ones."""
    sums, got = expected_sums(frames), results(out)
    assert not p.agg_count.any(), "a use is stranded half aggregated"
    assert not p.shed_held.any(), "a use is stranded half shed"
    shed = set(sums) - set(got)
    for key, by_port in got.items():
        assert sorted(by_port) == [w.port for w in job.workers], key
        for value in by_port.values():
            assert np.array_equal(value, sums[key]), key
    for slot, ver in shed:  # nothing of a shed use touched the registers
        assert p.agg_seen[slot + ver * p.pool_slots] == 0
    closed = p.counters["MyIngress.slots_closed"][0, 0]
    assert closed == len(got)
    assert p.counters["MyIngress.agg_packets"][0, 0] == WORKERS * closed
    assert p.shed_packets == WORKERS * len(shed)
    return shed


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_shedding_takes_whole_uses_and_retransmissions_complete_them(seed):
    """The workers' windows arrive in random bursts, interleaved, each at a random
    shed level (none, some, all): whatever the order, a use is whole or shed."""
    rng = random.Random(seed)
    job = make_job()
    frames = bench._frames(job, bench.BENCH_SLOTS)  # two uses of every slot
    out = []
    p = make_pipeline(job, out)
    feed = Feeder(p)
    streams = {w.index: [f for k, f in frames if k == w.index] for w in job.workers}
    levels = [0, SHED_FULL // 4, SHED_FULL // 2, SHED_FULL]
    while any(streams.values()):
        w = rng.choice([k for k, s in streams.items() if s])
        size = rng.randrange(1, 129)
        chunk, streams[w] = streams[w][:size], streams[w][size:]
        feed.burst(w + 1, chunk, rng.choice(levels))
    shed = check_whole(p, job, frames, out)
    assert 0 < len(shed) < len(expected_sums(frames)), "the test would prove nothing"
    # The workers retransmit what got no result (flagged, as agents do); the switch
    # is not overloaded any more: every shed use completes with the exact sum.
    retx = [(k, f[:FLAGS_AT] + bytes([f[FLAGS_AT] | FLAG_RETX]) + f[FLAGS_AT + 1:])
            for k, f in frames if use_of(f) in shed]
    before = len(out)
    for w in job.workers:
        feed.burst(w.port, [f for k, f in retx if k == w.index], 0)
    got = results(out[before:])
    sums = expected_sums(frames)
    assert set(got) == shed
    for key, by_port in got.items():
        assert len(by_port) == WORKERS
        assert all(np.array_equal(v, sums[key]) for v in by_port.values())
    assert not p.agg_count.any() and not p.shed_held.any()


def test_a_use_shed_before_a_worker_sent_again_is_judged_afresh():
    """A worker whose contribution was shed sends it again before the others came
    (one of theirs was lost on the way): the switch takes the use afresh, and it
    completes once every worker's contribution is in."""
    job = make_job()
    frames = bench._frames(job, bench.BENCH_SLOTS)[:4 * 8]  # slots 0..7 of use 0
    out = []
    p = make_pipeline(job, out)
    feed = Feeder(p)
    mine = {w.index: [f for k, f in frames if k == w.index] for w in job.workers}
    feed.burst(1, mine[0], SHED_FULL)  # worker 0: shed
    feed.burst(2, mine[1], 0)  # worker 1: the use was being shed, so shed too
    assert p.shed_packets == 16 and not p.agg_count.any()
    feed.burst(1, mine[0], 0)  # worker 0 again: taken afresh
    assert (p.agg_count[:8] == 1).all()
    for w in (1, 2, 3):  # the others' retransmissions (and firsts) complete it
        feed.burst(w + 1, mine[w], SHED_FULL)
    got = results(out)
    sums = expected_sums(frames)
    assert set(got) == set(sums)
    assert all(np.array_equal(v, sums[k]) for k, d in got.items() for v in d.values())
    assert not p.agg_count.any() and not p.shed_held.any()


def send_while_stopped(lab, senders, streams) -> int:
    """Each sender's frames (``streams``: port -> frames) into the switch's rings while
    it is stopped (SIGSTOP), then resumed; returns the uses it closed once caught up."""
    import os
    import signal
    import time
    os.kill(lab.target.pid, signal.SIGSTOP)
    try:
        for s in senders:
            rows = np.array(streams[s.number])
            for start in range(0, len(rows), 256):
                s.send_block(rows[start:start + 256])
                while not s.flush():
                    time.sleep(0.001)
        time.sleep(0.2)
    finally:
        os.kill(lab.target.pid, signal.SIGCONT)
    closed = -1
    for _ in range(100):  # until the switch has caught up
        time.sleep(0.2)
        now = lab.conn.read_counter("MyIngress.slots_closed")[0][0]
        if now == closed:
            return closed
        closed = now
    return closed


@pytest.mark.root
def test_a_stopped_switch_sheds_whole_uses_when_it_resumes(tmp_path_factory):
    """The switch is stopped (SIGSTOP) while every worker port's receive ring fills
    almost to the end; resumed, it is thousands of frames behind and sheds. No use
    may be left half aggregated or half shed; each aggregated one holds the exact
    sum, every frame is aggregated, shed or dropped by the kernel, and some are shed."""

    from conftest import open_lab
    from qaina_bench.harness.switches.jobs import program_aggregator, program_job, program_route
    from qaina_bench.p4.constants import POOL_SLOTS
    from qaina_bench.p4.embedded.ports import RX_RING_FRAMES, Port

    lab = open_lab("embedded", tmp_path_factory, ports=WORKERS)
    senders = []
    try:
        lab.reset()
        job = make_job(POOL_SLOTS)  # every slot copy of the pool is used once
        program_aggregator(lab.conn, bench.AGG_IP)
        program_job(lab.conn, job)
        for w in job.workers:
            program_route(lab.conn, w.ip, 32, w.port)
        per_port = RX_RING_FRAMES - 8  # room for a stray frame or two
        streams = {w.port: [np.frombuffer(f, np.uint8) for k, f in
                            bench._frames(job, POOL_SLOTS) if k == w.index][:per_port]
                   for w in job.workers}
        sent = [(w.index, bytes(f)) for w in job.workers for f in streams[w.port]]
        senders = [Port(i, lab.veths.pairs[i][1], receive=False) for i in streams]
        closed = send_while_stopped(lab, senders, streams)
        count = lab.conn.read_register("MyIngress.agg_count")
        seen = lab.conn.read_register("MyIngress.agg_seen")
        sums_cells = lab.conn.read_register("MyIngress.agg_sum")
        aggregated = lab.conn.read_counter("MyIngress.agg_packets")[0][0]
    finally:
        for s in senders:
            s.close()
        lab.close()
    stats = bench._switch_stats(lab.target.log_path)
    assert not any(count.values()), "a use is stranded half aggregated"
    words = len(sums_cells) // (2 * POOL_SLOTS)
    done = shed = 0
    for (slot, ver), total in expected_sums(sent).items():
        copy = slot + ver * POOL_SLOTS
        row = np.array([sums_cells[copy * words + i] for i in range(words)], np.uint32)
        if not row.any():  # never touched (the registers started at zero)
            assert seen[copy] == 0, (slot, ver)
            shed += 1
            continue
        # Every worker's bit, unless its next use of the slot cleared them all.
        assert seen[copy] in (0, (1 << WORKERS) - 1), (slot, ver)
        assert np.array_equal(row, total), (slot, ver)
        done += 1
    assert closed == done and aggregated == WORKERS * done
    assert stats["shed"] > 0, "nothing was shed: the test would prove nothing"
    assert stats["kernel_drops"] == 0
    assert stats["shed"] == len(sent) - aggregated == WORKERS * shed


def junk_frame(kind: str) -> bytes:
    """A frame the pipeline drops: of an unknown EtherType, or 802.1Q-tagged (the
    kernel takes the tag off and the switch puts it back, in a frame buffer of its
    own: a shedding switch reads up to 256 such frames at once)."""
    if kind == "ethertype":
        return b"\x02\0\0\0\0\x01\x02\0\0\0\0\x02\x88\xb5" + bytes(100)
    from scapy.all import IP, UDP, Dot1Q, Ether, raw
    return raw(Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02") / Dot1Q(vlan=5)
               / IP(src="10.0.0.1", dst="10.0.1.5") / UDP(sport=1, dport=2) / bytes(60))


@pytest.mark.root
@pytest.mark.parametrize("kind", ["ethertype", "vlan"])
def test_a_port_flooded_with_junk_sheds_alone(tmp_path_factory, kind):
    """A host that is no member fills its port's ring with frames the pipeline drops
    anyway (here while the switch is stopped); the workers' rings hold far less than
    the shed threshold. Their contributions are all aggregated, none shed: the flooded
    port's backlog is its own. The switch lives on and counts the junk as dropped."""
    import json

    from conftest import open_lab
    from qaina_bench.harness.switches.jobs import program_aggregator, program_job, program_route
    from qaina_bench.p4.embedded.loop import Overload
    from qaina_bench.p4.embedded.ports import Port

    uses, junk = 200, Overload.FULL + 100  # each use twice (both copies): 400 frames a port
    assert 2 * uses < Overload.LOW
    lab = open_lab("embedded", tmp_path_factory, ports=WORKERS + 1)
    senders = []
    try:
        lab.reset()
        job = make_job(uses)
        program_aggregator(lab.conn, bench.AGG_IP)
        program_job(lab.conn, job)
        for w in job.workers:
            program_route(lab.conn, w.ip, 32, w.port)
        streams = {w.port: np.array([np.frombuffer(f, np.uint8) for k, f in
                                     bench._frames(job, uses) if k == w.index])
                   for w in job.workers}
        flood = WORKERS + 1
        streams[flood] = np.frombuffer(junk_frame(kind), np.uint8)[None, :].repeat(junk, axis=0)
        senders = [Port(i, lab.veths.pairs[i][1], receive=False) for i in streams]
        names = {i: lab.veths.pairs[i][0] for i in streams}  # the switch's side
        closed = send_while_stopped(lab, senders, streams)
        alive = lab.target.proc.poll() is None
        dropped = lab.conn.read_counter("MyIngress.drops")[Drop.NOT_IPV4][0]
    finally:
        for s in senders:
            s.close()
        lab.close()
    assert alive, "the switch died under the flood"
    stats = json.loads(lab.target.stats_path.read_text())
    ports = {i: stats[names[i]] for i in streams}
    assert dropped >= ports[flood]["rx"] - ports[flood]["shed"]  # (and any stray frame)
    assert ports[flood]["rx"] + ports[flood]["rx_dropped"] >= junk  # the flood got there
    assert all(ports[w.port]["shed"] == 0 for w in job.workers), ports
    assert closed == 2 * uses, f"{closed} of {2 * uses} uses aggregated"


def test_runs_of_kept_frames_are_every_run_of_true():
    """``burst._runs`` against a plain walk, for every mask of up to 8 frames."""
    import itertools
    from qaina_bench.p4.embedded.burst import _runs
    for n in range(1, 9):
        for bits in itertools.product([False, True], repeat=n):
            want, start = [], None
            for i, b in enumerate((*bits, False)):
                if b and start is None:
                    start = i
                elif not b and start is not None:
                    want.append((start, i))
                    start = None
            assert _runs(np.array(bits)) == want, bits
