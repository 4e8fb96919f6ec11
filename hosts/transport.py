"""How an agent moves chunks through its job's slots: loss recovery and congestion
control, TCP's rules applied to per-chunk results.

A worker streams chunks ``k0 .. k0 + n - 1``; chunk ``k`` uses slot
``slot_base + k % S`` and copy ``(k // S) % 2`` of the job's ``S`` slots, and goes out
only once the result of chunk ``k - S`` (the slot's previous use) is in. The result
of a chunk acknowledges it, as a selective acknowledgement would.

Loss recovery:

* **RTT** per RFC 6298: SRTT and RTTVAR from samples, RTO = SRTT + 4 RTTVAR clamped to
  ``[rto_min, rto_max]``; Karn's rule: a chunk sent more than once gives no sample.
* **One retransmission timer** (RFC 6298 5.1-5.7): started when a chunk goes out and
  none is running, restarted whenever a result arrives. When it expires, every chunk
  outstanding for an RTO or longer is resent, the RTO doubles, and it stays doubled
  until a new sample. A queue that slows results down delays the timer instead of
  firing it; a timer that fired backs off instead of firing again and again.
* **Fast retransmit**: a chunk still outstanding after results for ``DUP_THRESHOLD``
  chunks sent after it arrived is resent at once. A worker's results come back in
  the order of its chunks unless something was lost: each slot completes when the
  slowest worker's contribution arrives, and every worker sends in chunk order over
  FIFO paths.

Congestion control, AIMD on the chunks in flight (TCP Reno's rules): the window starts
at ``INITIAL_WINDOW`` chunks, grows by one per result up to ``ssthresh`` (slow start),
then by ``1 / window`` per result; a loss (fast retransmit or timeout) halves it (at
least one chunk) and sets ``ssthresh`` to it, once per window of data. It never
exceeds the job's slots. On a loss-free path it opens to the slots and stays there;
where the switch drops bursts (BMv2 on capture) it settles below that.
"""

from __future__ import annotations

import errno
import math
import select
import socket
import time
from dataclasses import dataclass, field

import numpy as np

from ..p4.header import (FIELD_OFFSETS, FLAG_RESULT, FLAG_RETX, QAINA_LEN, QAINA_STRUCT,
                         QAINA_WORDS, wire)

_FLAGS = FIELD_OFFSETS["flags"]

INITIAL_WINDOW = 4
DUP_THRESHOLD = 3
RTO_INITIAL = 0.2  # seconds, before the first RTT sample


class RttEstimator:
    """RFC 6298 retransmission timeout."""

    def __init__(self, rto_min: float, rto_max: float, initial: float = RTO_INITIAL):
        self.rto_min = rto_min
        self.rto_max = rto_max
        self.srtt: float | None = None
        self.rttvar = 0.0
        self.rto = min(rto_max, max(rto_min, initial))
        self.backoffs = 0  # doublings since the last sample

    def sample(self, rtt: float):
        """A round trip of a chunk sent once (Karn's rule: never of a resent one)."""
        if self.srtt is None:
            self.srtt, self.rttvar = rtt, rtt / 2
        else:
            self.rttvar = 0.75 * self.rttvar + 0.25 * abs(self.srtt - rtt)
            self.srtt = 0.875 * self.srtt + 0.125 * rtt
        self.rto = min(self.rto_max, max(self.rto_min, self.srtt + 4 * self.rttvar))
        self.backoffs = 0

    def backoff(self):
        """The timer expired: double the RTO until the next sample (RFC 6298 5.5)."""
        self.rto = min(self.rto_max, 2 * self.rto)
        self.backoffs += 1


class CongestionWindow:
    """How many chunks may be in flight (AIMD, see the module docstring)."""

    def __init__(self, limit: int, initial: int = INITIAL_WINDOW):
        self.limit = limit
        self.cwnd = float(min(limit, initial))
        self.ssthresh = float(limit)
        self.recovery_end = -1  # losses of chunks before this one do not cut again
        self.losses = 0  # cuts so far

    @property
    def allowed(self) -> int:
        return max(1, int(self.cwnd))

    def on_result(self):
        if self.cwnd < self.ssthresh:
            self.cwnd += 1
        else:
            self.cwnd += 1 / self.cwnd
        self.cwnd = min(self.cwnd, float(self.limit))

    def on_loss(self, chunk: int, next_chunk: int):
        """Chunk ``chunk`` was lost; ``next_chunk`` is the next one not yet sent."""
        if chunk < self.recovery_end:
            return  # the same window of data: cut once
        self.ssthresh = max(1.0, math.floor(self.cwnd / 2))
        self.cwnd = self.ssthresh
        self.recovery_end = next_chunk
        self.losses += 1


@dataclass
class ExchangeStats:
    """What one ``SlotStream.exchange`` did on the wire."""

    packets_sent: int = 0
    packets_received: int = 0
    retransmissions: int = 0  # timeouts and fast retransmits together
    timeouts: int = 0  # timer expiries
    fast_retransmits: int = 0
    duplicates: int = 0  # results for chunks already done (harmless)
    refused: int = 0  # datagrams that are not a result of the job's aggregator for us
    send_errors: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    first_send: float = 0.0
    rtts: list = field(default_factory=list)
    window_mean: float = 0.0  # chunks allowed in flight, mean over sends


class StreamStalled(RuntimeError):
    """No result arrived for too long."""


class SlotStream:
    """A worker's stream of chunks through its job's slots on the aggregator."""

    def __init__(self, sock: socket.socket, aggregator: tuple[str, int], job_id: int,
                 worker: int, slot_base: int, slots: int, rto_min: float, rto_max: float,
                 stall_timeout: float, words: int = QAINA_WORDS):
        self.sock = sock
        self.words = words  # payload words per chunk (the switch's build)
        self.packet_len = wire(words).datagram_len  # UDP payload of one chunk
        self.dest = aggregator
        self.job_id = job_id
        self.worker = worker
        self.slot_base = slot_base
        self.slots = slots
        self.stall_timeout = stall_timeout
        self.rtt = RttEstimator(rto_min, rto_max)
        self.window = CongestionWindow(slots)
        self.position = 0  # sequence number of the next chunk in the job's stream

    def packet(self, k: int, exp: int, words, flags: int = 0) -> bytes:
        """The datagram of chunk ``k`` (its slot and copy follow from ``k``)."""
        slot = self.slot_base + k % self.slots
        ver = (k // self.slots) % 2
        return QAINA_STRUCT.pack(self.job_id, self.worker, flags, slot, ver, exp,
                                 k & 0xFFFFFFFF) + words.tobytes()

    def exchange(self, n: int, build):
        """Send ``n`` chunks and collect their results.

        ``build(c, agreed)`` returns (exponent to carry, big-endian words) of chunk
        ``c`` when it is sent; ``agreed`` holds the exponents returned so far.
        Returns (result words as uint32 [n, words], agreed exponents [n], stats).
        """
        run = _Exchange(self, n, build)
        run.loop()
        self.position += n
        return run.results.astype(np.uint32), run.agreed, run.stats


class _Exchange:
    """The state of one ``SlotStream.exchange``: chunks in flight, results, timer."""

    def __init__(self, stream: SlotStream, n: int, build):
        self.s = stream
        self.n = n
        self.build = build
        self.k0 = stream.position
        self.results = np.zeros((n, stream.words), dtype=">u4")
        self.agreed = np.zeros(n, dtype=np.int8)
        self.got = np.zeros(n, dtype=bool)
        # chunk -> [packet, last send time, sent more than once, later results seen];
        # in chunk order, which is send order (a resend does not move a chunk).
        self.pending: dict[int, list] = {}
        self.stats = ExchangeStats(first_send=time.time())
        self.next_c = 0
        self.done = 0
        self.timer: float | None = None  # when the retransmission timer expires
        self.last_progress = time.monotonic()
        self.windows = 0.0

    def loop(self):
        buf = bytearray(2048)
        sock = self.s.sock
        while self.done < self.n:
            self.fill()
            now = time.monotonic()
            wait = 0.05 if self.timer is None else min(0.05, max(0.0, self.timer - now))
            if select.select([sock], [], [], wait)[0]:
                self.receive(buf)
            now = time.monotonic()
            if self.timer is not None and now >= self.timer:
                self.expire(now)
            if self.pending and now - self.last_progress > self.s.stall_timeout:
                raise StreamStalled(
                    f"no result for {self.s.stall_timeout:.0f} s with {len(self.pending)} "
                    f"chunks outstanding (is the switch up, the job programmed, the route "
                    f"to {self.s.dest[0]} there?)")
        sent = self.stats.packets_sent - self.stats.retransmissions
        self.stats.window_mean = self.windows / sent if sent else 0.0

    def fill(self):
        """Send new chunks while the window and the slots allow."""
        s, got, pending = self.s, self.got, self.pending
        S = s.slots
        while (self.next_c < self.n and len(pending) < s.window.allowed
               and (self.next_c < S or got[self.next_c - S])):
            c = self.next_c
            exp, words = self.build(c, self.agreed)
            pkt = s.packet(self.k0 + c, exp, words)
            now = time.monotonic()
            self.send(pkt)
            pending[c] = [pkt, now, False, 0]
            self.windows += s.window.allowed
            if self.timer is None:
                self.timer = now + s.rtt.rto
            self.next_c += 1

    def send(self, pkt: bytes):
        """One datagram; a full or lossy egress queue (ENOBUFS) is a lost packet."""
        self.stats.packets_sent += 1
        try:
            self.s.sock.sendto(pkt, self.s.dest)
        except OSError as exc:
            if exc.errno not in (errno.ENOBUFS, errno.EAGAIN):
                raise
            self.stats.send_errors += 1

    def resend(self, c: int, now: float):
        entry = self.pending[c]
        pkt = entry[0]
        if not entry[2]:
            pkt = entry[0] = pkt[:_FLAGS] + bytes([pkt[_FLAGS] | FLAG_RETX]) + pkt[_FLAGS + 1:]
        entry[1], entry[2], entry[3] = now, True, 0
        self.stats.retransmissions += 1
        self.send(pkt)
        self.s.window.on_loss(c, self.next_c)

    def receive(self, buf: bytearray):
        s, stats, pending = self.s, self.stats, self.pending
        recvfrom_into = s.sock.recvfrom_into
        while True:
            try:
                size, source = recvfrom_into(buf)
            except BlockingIOError:
                return
            if size != s.packet_len or source != s.dest:
                stats.refused += 1
                continue
            job, worker, flags, _, _, exp, seq = QAINA_STRUCT.unpack_from(buf, 0)
            c = (seq - self.k0) & 0xFFFFFFFF
            if job != s.job_id or worker != s.worker or not flags & FLAG_RESULT:
                stats.refused += 1
                continue
            stats.packets_received += 1
            entry = pending.pop(c, None) if c < self.n else None
            if entry is None:
                stats.duplicates += 1
                continue
            now = time.monotonic()
            if not entry[2]:  # Karn's rule
                rtt = now - entry[1]
                stats.rtts.append(rtt)
                s.rtt.sample(rtt)
            self.results[c] = np.frombuffer(buf, ">u4", s.words, QAINA_LEN)
            self.agreed[c] = exp
            self.got[c] = True
            self.done += 1
            self.last_progress = now
            s.window.on_result()
            self.timer = now + s.rtt.rto if pending else None
            for older, e in pending.items():  # chunks sent before c, still outstanding
                if older >= c:
                    break
                e[3] += 1
                if e[3] == DUP_THRESHOLD:
                    stats.fast_retransmits += 1
                    self.resend(older, now)

    def expire(self, now: float):
        """The retransmission timer fired: resend what waited an RTO, back off."""
        stats, rto = self.stats, self.s.rtt.rto
        stats.timeouts += 1
        for c, entry in self.pending.items():
            if now - entry[1] >= rto or c == next(iter(self.pending)):
                self.resend(c, now)
        self.s.rtt.backoff()
        self.timer = now + self.s.rtt.rto if self.pending else None
