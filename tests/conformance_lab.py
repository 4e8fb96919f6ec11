"""What the conformance suites share: the ``lab`` fixture (a switch of each target
on veth pairs, programmed over P4Runtime by the harness's control plane), the ``sw``
fixture (a fresh pipeline with the aggregator and host routes), and helpers that build
contributions and check results. Ports 1..4 face the workers, port 5 another host.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.utils import checksum

from qaina_bench.harness.switches.jobs import (Job, Worker, aggregator_ip, aggregator_mac, int_to_ip,
                                      ip_to_int, mac_to_int, program_aggregator, program_job,
                                      program_route)
from qaina_bench.hosts.lanes import LaneFormat
from conftest import kinds, open_lab
from qaina_bench.p4.header import FLAG_RESULT, PAYLOAD_WORDS, QAINA_UDP_PORT, scapy_layer

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


def results(lab, port: int, count=None, timeout=None):
    """The frames that reach ``port``: the first ``count`` of them (waiting up to 10 s:
    a busy machine's switch answers late), or all within ``timeout`` (1 s by default)."""
    if timeout is None:
        timeout = 1.0 if count is None else 10.0
    return [Ether(f) for f in lab.hosts[port].recv(timeout=timeout, count=count)]


def count(lab, name: str, index: int, expected: int, timeout: float = 10.0) -> int:
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
    return checksum(bytes(pkt[IP])[:pkt[IP].ihl * 4]) == 0


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
