"""The fallback host of a job under ``--allocation shared`` (ATP's parameter server).

With the shared policy every chunk of every job is placed on a copy of one shared
region of the switch's pool by a hash of (job, sequence number)
(``transport.placement``). The switch aggregates a chunk when its copy is free or already holds that chunk; a
contribution whose copy holds another chunk collides and the switch sends it here as
a single (``FLAG_FALLBACK``, the worker's index kept). The switch also sends every sum it
completed here (worker ``FALLBACK_WORKER``) and keeps the copy until this host's
result comes back through it: that result releases the copy (ATP's ACK).

The host answers each chunk once it has all of it, either the switch's complete sum
or a single from every worker, by sending the result to the aggregator address; the
switch multicasts it to the job's workers. A chunk split between the switch and this
host (some workers collided, the others' contributions claimed the copy later) is
completed here: for every chunk it holds singles of, the host asks the switch for
the partial sum of the other workers (``FLAG_FLUSH``, the singles' workers in payload
word 0), at once and again every ``FLUSH_EVERY`` s; the switch answers with that sum
(worker ``FALLBACK_PARTIAL``) when its copy holds exactly the other workers, and gives
the copy up. A worker that waits retransmits meanwhile, and the switch gives up a copy
whose use a retransmission shows stuck and sends the rest here as singles. Results are
kept to answer retransmissions of workers whose result was lost.

Sums are the switch's: wrapping 32-bit addition of the packed words, the maximum of
the scale exponents. Run as ``python -m qaina_bench.hosts.fallback CONFIG.json``;
it serves until SIGTERM and then writes its counts (``FallbackStats``) to the path the
config names.
"""

from __future__ import annotations

import json
import signal
import socket
import sys
import time
from collections import OrderedDict
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ..p4.header import (FALLBACK_PARTIAL, FALLBACK_WORKER, FLAG_FALLBACK, FLAG_FLUSH,
                         FLAG_RESULT, QAINA_UDP_PORT, wire)

#: chunks whose result (or half-gathered singles) the host keeps
KEEP = 1 << 16
FLUSH_EVERY = 0.02  # s between requests for a split chunk's partial sum
FLUSH_FOR = 2.0  # s after its last single a chunk is asked for no more


@dataclass
class FallbackStats:
    """What a fallback host did (written as JSON when it stops)."""

    chunks_switch: int = 0  # chunks the switch aggregated whole (their sum came here)
    chunks_hosts: int = 0  # chunks completed here from every worker's single
    chunks_split: int = 0  # chunks completed here from singles and the switch's partial
    flushes: int = 0  # requests for a partial sum sent to the switch
    singles: int = 0  # single contributions received (collided or given up)
    duplicates: int = 0  # singles of a worker already held for their chunk
    resent: int = 0  # results sent again (a chunk already complete came back)
    results_sent: int = 0  # result datagrams sent, resent ones included
    refused: int = 0  # datagrams not from the aggregator, of another job or malformed
    unfinished: int = 0  # chunks with singles but no result when the host stopped

    @property
    def switch_share(self) -> float | None:
        """Share of the job's chunks the switch aggregated whole."""
        total = self.chunks_switch + self.chunks_hosts + self.chunks_split
        return self.chunks_switch / total if total else None


class FallbackAggregator:
    """The chunks of one job: singles gathered, results kept (no I/O)."""

    def __init__(self, job_id: int, workers: int, words: int, keep: int = KEEP):
        self.job_id = job_id
        self.full = (1 << workers) - 1
        self.wire = wire(words)
        self.keep = keep
        self.stats = FallbackStats()
        #: seq -> [mask of workers held, word sums (uint32), max exponent, slot, ver,
        #: time of the last single, time of the last flush]
        self.partial: OrderedDict[int, list] = OrderedDict()
        #: seq -> result datagram
        self.done: OrderedDict[int, bytes] = OrderedDict()

    def take(self, datagram, now: float = 0.0) -> bytes | None:
        """One datagram from the switch at time ``now``; returns the datagram to send
        to the switch, if any: the chunk's result, or a request for its partial sum."""
        if len(datagram) != self.wire.datagram_len:
            self.stats.refused += 1
            return None
        d = np.frombuffer(datagram, dtype=self.wire.dtype, count=1)[0]
        job, worker, flags, seq = int(d["job_id"]), int(d["worker"]), int(d["flags"]), int(d["seq"])
        if job != self.job_id or flags & FLAG_RESULT:
            self.stats.refused += 1
            return None
        if worker == FALLBACK_WORKER:  # the switch's complete sum
            if seq not in self.done:
                self.stats.chunks_switch += 1
                self.partial.pop(seq, None)
                return self._finish(seq, d["words"], int(d["exp"]), int(d["slot"]), int(d["ver"]))
            return self._again(seq)
        if worker == FALLBACK_PARTIAL:  # the switch's sum of the workers we lack
            entry = self.partial.pop(seq, None)
            if entry is None:  # complete already
                return None
            self.stats.chunks_split += 1
            np.add(entry[1], d["words"].astype(np.uint32), out=entry[1])
            return self._finish(seq, entry[1], max(entry[2], int(d["exp"])), entry[3], entry[4])
        if not flags & FLAG_FALLBACK or not (1 << worker) & self.full:
            self.stats.refused += 1
            return None
        self.stats.singles += 1
        if seq in self.done:
            return self._again(seq)
        entry = self.partial.get(seq)
        if entry is None:
            entry = self.partial[seq] = [0, np.zeros(self.wire.words, dtype=np.uint32), -128,
                                         int(d["slot"]), int(d["ver"]), now, now]
            if len(self.partial) > self.keep:
                self.partial.popitem(last=False)
        bit = 1 << worker
        if entry[0] & bit:
            self.stats.duplicates += 1
            return None
        entry[0] |= bit
        np.add(entry[1], d["words"].astype(np.uint32), out=entry[1])
        entry[2] = max(entry[2], int(d["exp"]))
        if entry[0] != self.full:
            entry[5] = entry[6] = now
            return self._flush(seq, entry)
        del self.partial[seq]
        self.stats.chunks_hosts += 1
        return self._finish(seq, entry[1], entry[2], entry[3], entry[4])

    def _flush(self, seq: int, entry: list) -> bytes:
        """The request for the partial sum of the workers ``entry`` lacks."""
        self.stats.flushes += 1
        have = np.zeros(self.wire.words, dtype=np.uint32)
        have[0] = entry[0]
        return self.wire.datagram(have, job_id=self.job_id, flags=FLAG_RESULT | FLAG_FLUSH,
                                  slot=entry[3], ver=entry[4], seq=seq)

    def flushes(self, now: float) -> list[bytes]:
        """Requests again for the chunks still split ``FLUSH_EVERY`` after the last
        one (for ``FLUSH_FOR`` after their last single)."""
        out = []
        for seq, entry in self.partial.items():
            if now - entry[6] >= FLUSH_EVERY and now - entry[5] < FLUSH_FOR:
                entry[6] = now
                out.append(self._flush(seq, entry))
        return out

    def _finish(self, seq: int, words, exp: int, slot: int, ver: int) -> bytes:
        result = self.wire.datagram(words, job_id=self.job_id, flags=FLAG_RESULT, slot=slot,
                                    ver=ver, exp=exp, seq=seq)
        self.done[seq] = result
        if len(self.done) > self.keep:
            self.done.popitem(last=False)
        self.stats.results_sent += 1
        return result

    def _again(self, seq: int) -> bytes:
        self.stats.resent += 1
        self.stats.results_sent += 1
        return self.done[seq]


@dataclass
class FallbackConfig:
    job_id: int
    workers: int
    words: int
    aggregator: str  # the address of the switch that aggregates the job
    output: str  # where the counts go when the host stops
    port: int = QAINA_UDP_PORT  # where it listens
    aggregator_port: int = QAINA_UDP_PORT  # where its results go


def serve(cfg: FallbackConfig, stop) -> FallbackAggregator:
    """Answer the switch until ``stop()`` is true (checked every ``FLUSH_EVERY``)."""
    agg = FallbackAggregator(cfg.job_id, cfg.workers, cfg.words)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    sock.bind(("0.0.0.0", cfg.port))
    sock.settimeout(FLUSH_EVERY)
    dest = (cfg.aggregator, cfg.aggregator_port)
    buf = bytearray(65536)
    view = memoryview(buf)
    last_flush = time.monotonic()

    def send(datagram):
        try:
            sock.sendto(datagram, dest)
        except OSError:  # a full queue: the workers retransmit, it comes again
            pass

    try:
        while not stop():
            try:
                size, sender = sock.recvfrom_into(buf)
            except socket.timeout:
                size = None
            now = time.monotonic()
            if size is not None:
                if sender[0] != cfg.aggregator:
                    agg.stats.refused += 1
                    continue
                out = agg.take(view[:size], now)
                if out is not None:
                    send(out)
            if now - last_flush >= FLUSH_EVERY:
                last_flush = now
                for out in agg.flushes(now):
                    send(out)
    finally:
        sock.close()
        agg.stats.unfinished = len(agg.partial)
    return agg


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m qaina_bench.hosts.fallback CONFIG.json", file=sys.stderr)
        return 2
    try:
        cfg = FallbackConfig(**json.loads(Path(argv[0]).read_text()))
    except (OSError, ValueError, TypeError) as exc:
        print(f"fallback host: cannot read {argv[0]}: {exc}", file=sys.stderr)
        return 2
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
    signal.signal(signal.SIGINT, lambda *_: stopping.append(1))
    try:
        agg = serve(cfg, lambda: bool(stopping))
    except OSError as exc:
        print(f"fallback host: {exc}", file=sys.stderr)
        return 1
    Path(cfg.output).write_text(json.dumps(asdict(agg.stats)))
    s = agg.stats
    print(f"fallback host of job {cfg.job_id}: {s.chunks_switch} chunks from the switch, "
          f"{s.chunks_hosts} from {s.singles} singles, {s.resent} results resent")
    return 0


if __name__ == "__main__":
    sys.exit(main())
