"""The shared policy's host side: where chunks land in the shared region, and the
fallback host's sums (no network needed; the switch's side is in test_conformance)."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from qaina_bench.harness.config import ConfigError, RunConfig
from qaina_bench.hosts.fallback import FallbackAggregator
from qaina_bench.hosts.transport import placement
from qaina_bench.p4.header import (FALLBACK_PARTIAL, FALLBACK_WORKER, FLAG_FALLBACK,
                                   FLAG_FLUSH, FLAG_RESULT, FLAG_RETX, wire)

W = wire(32)


def single(words, worker, seq, exp=0, flags=FLAG_FALLBACK, job=3):
    return W.datagram(words, job_id=job, worker=worker, flags=flags, slot=9, ver=1, exp=exp,
                      seq=seq)


def result_of(datagram):
    return np.frombuffer(datagram, dtype=W.dtype)[0]


def test_placement_spreads_chunks_over_both_copies_of_the_region_deterministically():
    seqs = np.arange(20000)
    slot, ver = placement(5, seqs, 100, 50)
    assert slot.min() == 100 and slot.max() == 149 and set(ver.tolist()) == {0, 1}
    copies = np.bincount((slot - 100) + 50 * ver, minlength=100)
    assert copies.min() > 120 and copies.max() < 280  # 200 per copy expected
    again = placement(5, seqs, 100, 50)
    assert (again[0] == slot).all() and (again[1] == ver).all()
    other = placement(6, seqs, 100, 50)
    assert np.mean(other[0] == slot) < 0.1  # another job's chunks land elsewhere


def test_singles_of_every_worker_make_the_exact_wrapping_sum_and_maximum_exponent():
    rng = np.random.default_rng(1)
    parts = rng.integers(0, 2**32, (4, 32), dtype=np.uint64)
    fb = FallbackAggregator(3, 4, 32)
    outs = [fb.take(single(parts[k], k, seq=70000, exp=[-3, 2, 0, -1][k])) for k in (2, 0, 3)]
    # each single asks the switch for the partial sum of the workers still missing
    for out, have in zip(outs, (0b0100, 0b0101, 0b1101)):
        f = result_of(out)
        assert int(f["flags"]) == FLAG_RESULT | FLAG_FLUSH and int(f["words"][0]) == have
        assert (int(f["seq"]), int(f["slot"]), int(f["ver"])) == (70000, 9, 1)
    assert fb.take(single(parts[0], 0, seq=70000)) is None  # a duplicate
    r = result_of(fb.take(single(parts[1], 1, seq=70000, exp=2)))
    assert (r["words"] == parts.sum(axis=0) % 2**32).all()
    assert (int(r["exp"]), int(r["flags"]), int(r["seq"]), int(r["slot"]), int(r["ver"])) == (
        2, FLAG_RESULT, 70000, 9, 1)
    s = fb.stats
    assert (s.chunks_hosts, s.chunks_switch, s.singles, s.duplicates) == (1, 0, 5, 1)
    assert s.flushes == 3 and not fb.partial


def test_the_switch_partial_completes_a_split_chunk_and_flushes_repeat_until_it_comes():
    rng = np.random.default_rng(2)
    parts = rng.integers(0, 2**32, (3, 32), dtype=np.uint64)
    fb = FallbackAggregator(3, 3, 32)
    fb.take(single(parts[1], 1, seq=4, exp=1), now=10.0)
    assert fb.flushes(10.01) == []  # not yet: one request per FLUSH_EVERY
    again = fb.flushes(10.03)
    assert len(again) == 1 and int(result_of(again[0])["words"][0]) == 0b010
    assert fb.flushes(13.0) == []  # a chunk quiet for long is asked no more
    partial = W.datagram((parts[0] + parts[2]) % 2**32, job_id=3, worker=FALLBACK_PARTIAL,
                         slot=9, ver=1, exp=3, seq=4)
    r = result_of(fb.take(partial))
    assert (r["words"] == parts.sum(axis=0) % 2**32).all() and int(r["exp"]) == 3
    assert fb.stats.chunks_split == 1 and fb.stats.switch_share == 0.0
    assert fb.take(partial) is None


def test_the_switch_sum_completes_a_chunk_and_late_packets_get_the_result_again():
    words = np.arange(32, dtype=np.uint32)
    fb = FallbackAggregator(3, 2, 32)
    assert fb.take(single(words, 1, seq=5)) is not None  # a single (asking), the switch...
    whole = W.datagram(words * 2, job_id=3, worker=FALLBACK_WORKER, slot=9, ver=1, exp=4, seq=5)
    r = fb.take(whole)
    assert (result_of(r)["words"] == words * 2).all() and int(result_of(r)["exp"]) == 4
    # ... a retransmission of a worker that lost the result, and the sum sent again
    assert fb.take(single(words, 0, seq=5, flags=FLAG_FALLBACK | FLAG_RETX)) == r
    assert fb.take(whole) == r
    s = fb.stats
    assert (s.chunks_switch, s.chunks_hosts, s.resent, s.results_sent) == (1, 0, 2, 3)
    assert fb.flushes(1e9) == []
    assert s.switch_share == 1.0 and not fb.partial


@pytest.mark.parametrize("datagram", [
    W.datagram(np.zeros(32), job_id=4, worker=0, flags=FLAG_FALLBACK, seq=1),  # another job
    W.datagram(np.zeros(32), job_id=3, worker=0, flags=FLAG_RESULT, seq=1),  # a result
    W.datagram(np.zeros(32), job_id=3, worker=0, flags=0, seq=1),  # not diverted
    W.datagram(np.zeros(32), job_id=3, worker=2, flags=FLAG_FALLBACK, seq=1),  # worker >= n
    b"\0" * 20])
def test_what_is_not_a_chunk_of_the_job_is_refused(datagram):
    fb = FallbackAggregator(3, 2, 32)
    assert fb.take(datagram) is None
    assert fb.stats.refused == 1 and not fb.partial


def test_the_shared_policy_is_checked_with_the_run_options():
    with pytest.raises(ConfigError, match="--mode ina"):
        RunConfig.flat(allocation="shared", mode="ring", trace="digits-mlp").check()
    with pytest.raises(ConfigError, match="--levels 1"):
        RunConfig.flat(allocation="shared", levels=2, trace="digits-mlp").check()
    with pytest.raises(ConfigError, match="static .* or shared"):
        RunConfig.flat(allocation="pooled", trace="digits-mlp").check()
    # windows that overlap in a small pool are the point of sharing
    RunConfig.flat(allocation="shared", jobs=4, slots=16, pool_slots=16, trace="digits-mlp").check()


def test_the_fallback_host_process_answers_over_udp_and_writes_its_counts(tmp_path):
    """The real process on loopback: two singles in, the sum out to the aggregator."""
    agg = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    agg.bind(("127.0.0.1", 0))
    agg.settimeout(1)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    out = tmp_path / "stats.json"
    cfg = tmp_path / "fb.json"
    cfg.write_text(json.dumps({"job_id": 3, "workers": 2, "words": 32, "aggregator": "127.0.0.1",
                               "output": str(out), "port": port,
                               "aggregator_port": agg.getsockname()[1]}))
    proc = subprocess.Popen([sys.executable, "-m", "qaina_bench.hosts.fallback", str(cfg)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        words = np.arange(32, dtype=np.uint32)
        deadline = time.monotonic() + 20
        got = None
        while got is None and time.monotonic() < deadline:  # until the process listens
            for k in (0, 1):
                agg.sendto(single(words + k, k, seq=8), ("127.0.0.1", port))
            try:
                while got is None:  # requests for a partial sum come first
                    data, _ = agg.recvfrom(4096)
                    if not int(result_of(data)["flags"]) & FLAG_FLUSH:
                        got = data
            except socket.timeout:
                pass
        assert got is not None
        assert (result_of(got)["words"] == 2 * words + 1).all()
    finally:
        proc.send_signal(signal.SIGTERM)
        text = proc.communicate(timeout=20)[0].decode()
        agg.close()
    assert proc.returncode == 0, text
    stats = json.loads(out.read_text())
    assert stats["chunks_hosts"] == 1 and stats["chunks_switch"] == 0
