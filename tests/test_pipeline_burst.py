"""The embedded switch's burst paths do exactly what its per-packet path does.

The conformance suite pins the per-packet behaviour to qaina.p4 with single packets.
Under load the switch reads bursts and applies a worker's window of contributions
with numpy (``burst.apply_window``) and multicasts results in blocks. Here the same
traffic goes through ``process`` frame by frame in one pipeline and through
``process_burst`` in another; every frame sent, register and counter must match.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from qaina_bench.harness.benchmarks import bench
from qaina_bench.harness.switches.jobs import (Job, Upstream, Worker, program_aggregator, program_guard,
                                      program_job, program_route)
from qaina_bench.p4.constants import Drop
from qaina_bench.hosts.lanes import LaneFormat
from qaina_bench.p4.embedded import burst
from qaina_bench.p4.embedded import pipeline as pl
from qaina_bench.p4.header import FALLBACK_WORKER, QAINA_OFFSET
from qaina_bench.p4.p4info import P4Info

INFO = P4Info.load()
BURST = 64


class Direct:
    """Control-plane writes straight into a Pipeline (what P4Runtime would do)."""

    def __init__(self, p):
        self.p = p

    def insert(self, table, match, action, params=None):
        self.insert_many([(table, match, action, params)])

    def insert_many(self, entries):
        for table, match, action, params in entries:
            t = self.p.table(table)
            a = INFO.action(action)
            key = tuple(match[mf.name] for mf in t.info.match_fields)
            t.insert(key, a.id, tuple((params or {})[p.name] for p in a.params))

    def set_multicast_group(self, group, replicas):
        self.p.mcast_groups[group] = list(replicas)


def burst_slots():
    """``BURST`` frame slots in one store, and the same memory as a uint8 row per slot
    (what a port's receive ring hands the pipeline)."""
    store = bytearray(BURST * 2052)
    slots = [pl.frame_slot(store, i * 2052 + pl.SLOT_ALIGN_OFFSET, 2048) for i in range(BURST)]
    rows = np.ndarray((BURST, 2048), np.uint8, buffer=store, offset=pl.SLOT_ALIGN_OFFSET,
                      strides=(2052, 1))
    return slots, rows


def make_pipeline(job, out):
    p = pl.Pipeline(INFO, tx=lambda port, frame: out.append((port, bytes(frame))))
    conn = Direct(p)
    program_aggregator(conn, bench.AGG_IP)
    program_job(conn, job)
    for w in job.workers:  # as in a run: each port admits its worker's address only
        program_route(conn, w.ip, 32, w.port)
        program_guard(conn, w.port, [w.ip])
    return p


def per_port(out):
    return {port: [f for q, f in out if q == port] for port in sorted({q for q, _ in out})}


@pytest.mark.parametrize("bits, faults", [(4, False), (32, False), (4, True)])
def test_burst_paths_match_the_per_packet_path(bits, faults, monkeypatch):
    job = Job(1, 0, LaneFormat(bits, 4), 0, bench.BENCH_SLOTS,
              [Worker(k, 0x0A000001 + k, 0x020000000001 + k, k + 1) for k in range(4)])
    rng = random.Random(bits + faults)
    exp_at = QAINA_OFFSET + 7  # the scale exponent differs from packet to packet
    frames = [(w, f[:exp_at] + bytes([rng.randrange(256)]) + f[exp_at + 1:])
              for w, f in bench._frames(job, bench.BENCH_SLOTS)]
    if faults:  # duplicates, junk and foreign packets mixed into the workers' windows
        junk = bytes(rng.getrandbits(8) for _ in range(182))
        for _ in range(60):
            k = rng.randrange(len(frames))
            w, f = frames[k]
            extra = rng.choice([f, junk, f[:26] + b"\x0a\x00\x00\x63" + f[30:]])
            frames.insert(k + 1, (w, extra))
        for _ in range(6):  # runs of another worker's contributions from this port
            k = rng.randrange(len(frames))
            w = frames[k][0]
            other = [f for v, f in frames if v == (w + 1) % 4][:8]
            frames[k + 1:k + 1] = [(w, f) for f in other]
    fast_bursts = []
    original = burst.apply_window

    def counting(*args):
        done = original(*args)
        fast_bursts.append(done)
        return done

    monkeypatch.setattr(burst, "apply_window", counting)
    out_ref, out_burst = [], []
    ref = make_pipeline(job, out_ref)
    new = make_pipeline(job, out_burst)
    slots, rows = burst_slots()
    for lap in range(3):
        for start in range(0, len(frames), 256):  # per-port bursts within each window
            window = frames[start:start + 256]
            for w in range(4):
                mine = [f for k, f in window if k == w]
                i = 0
                while i < len(mine):
                    chunk = mine[i:i + rng.randrange(1, BURST + 1)]
                    i += len(chunk)
                    for f in chunk:
                        ref.process(w + 1, f)
                    for n, f in enumerate(chunk):
                        slots[n][0][:len(f)] = f
                    new.process_burst(w + 1, slots[:len(chunk)], [len(f) for f in chunk],
                                      rows[:len(chunk)])
    assert any(fast_bursts), "no burst took the numpy path: the test would prove nothing"
    assert per_port(out_ref) == per_port(out_burst)
    for name in ref.registers:
        assert np.array_equal(ref.registers[name], new.registers[name]), name
    for name in ref.counters:
        assert np.array_equal(ref.counters[name], new.counters[name]), name
    assert ref.counters["MyIngress.slots_closed"][0, 0] > 0
    assert (ref.counters["MyIngress.drops"][Drop.SPOOFED_SOURCE, 0] > 0) == faults



@pytest.mark.parametrize("shed_level", [0, 3])
def test_a_shared_jobs_bursts_take_the_per_packet_path(shed_level):
    """The burst path declines a job of the shared allocation (as it declines two
    levels), shedding or not: its windows run frame by frame, as ``process`` runs them,
    and nothing of it is shed."""
    up = Upstream(9, 0x0A0001FE, 0x0200000001FE, FALLBACK_WORKER)
    job = Job(1, 0, LaneFormat(4, 4), 0, bench.BENCH_SLOTS,
              [Worker(k, 0x0A000001 + k, 0x020000000001 + k, k + 1) for k in range(4)],
              up, shared=True)
    frames = bench._frames(job, bench.BENCH_SLOTS)
    out_ref, out_burst = [], []
    ref = make_pipeline(job, out_ref)
    new = make_pipeline(job, out_burst)
    slots, rows = burst_slots()
    for w in range(4):
        mine = [f for k, f in frames if k == w]
        for i in range(0, len(mine), BURST):
            chunk = mine[i:i + BURST]
            for f in chunk:
                ref.process(w + 1, f)
            for n, f in enumerate(chunk):
                slots[n][0][:len(f)] = f
            lengths = [len(f) for f in chunk]
            assert not burst.take_burst(new, w + 1, slots[:len(chunk)], lengths,
                                        rows[:len(chunk)], shed_level, shedding=shed_level > 0)
            new.process_burst(w + 1, slots[:len(chunk)], lengths, rows[:len(chunk)],
                              shed_level=shed_level)
    assert per_port(out_ref) == per_port(out_burst)
    assert len(per_port(out_ref)[9]) == 2 * bench.BENCH_SLOTS  # every use went to the host
    for name in ref.registers:
        assert np.array_equal(ref.registers[name], new.registers[name]), name
    for name in ref.counters:
        assert np.array_equal(ref.counters[name], new.counters[name]), name
    assert new.shed_packets == 0 and new.internal_errors == 0
