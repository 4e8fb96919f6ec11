"""How an agent moves chunks through its job's slots: loss recovery and congestion
control, TCP's rules applied to per-chunk results.

A worker streams chunks ``k0 .. k0 + n - 1``; chunk ``k`` uses slot
``slot_base + k % S`` and copy ``(k // S) % 2`` of the job's ``S`` slots, and goes out
only once the result of chunk ``k - S`` (the slot's previous use) is in. The result
of a chunk acknowledges it, as a selective acknowledgement would. Under
``--allocation shared`` chunk ``k`` goes to the copy ``placement`` hashes it onto in
the pool all jobs share instead, and ``S`` is only the window.

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

Receive coalescing (interrupt moderation, as NICs do): where results trickle in one
or two at a time (a shaped link paces them), an agent that took each on its own
would spend per result what a batch costs per batch, and a run that should be bound
by its links would be bound by the agents' CPU instead. So when a wakeup brought
fewer results than a batch and the rest of one is on the way, the agent waits for it
to arrive (``linger``): the results' mean gap times the results missing, at most a
quarter of the smoothed round trip (``COALESCE_SHARE``; ``COALESCE_MAX`` before the
first sample, and at least that). The window keeps the bottleneck's queue filled
meanwhile; the round trips measured include the waits, which bounds them (a wait
of a quarter of SRTT settles SRTT at 4/3 of the path's). Results that come in
bursts (unshaped links) are taken at once.
"""

from __future__ import annotations

import errno
import math
import os
import select
import socket
import time
from dataclasses import dataclass, field

import numpy as np

from ..p4.header import FIELD_OFFSETS, FLAG_RESULT, FLAG_RETX, QAINA_WORDS, wire

INITIAL_WINDOW = 4
DUP_THRESHOLD = 3
RTO_INITIAL = 0.2  # seconds, before the first RTT sample
#: receive coalescing: the longest wait for the rest of a batch of results, as a
#: share of SRTT, and in seconds before the first RTT sample (and at least that);
#: ``QAINA_AGENT_COALESCE=0`` turns it off, for comparisons
COALESCE_SHARE = 0.25
COALESCE_MAX = 0.002
COALESCE = os.environ.get("QAINA_AGENT_COALESCE", "1") != "0"
#: job_id (16 bits), worker (8) and the result flag of a header's first word
_LEAD_MASK = np.uint32(0xFFFFFF00 | FLAG_RESULT)


def placement(job_id: int, seqs: np.ndarray, base: int, slots: int) -> tuple[np.ndarray,
                                                                            np.ndarray]:
    """(slot, ver) of chunks ``seqs`` of job ``job_id`` in the shared region
    ``base .. base + slots - 1`` (both copies of each slot): a hash of (job, seq)
    spread over the region's ``2 * slots`` copies, as ATP hashes its aggregators."""
    x = (np.asarray(seqs, dtype=np.uint64) & np.uint64(0xFFFFFFFF)) | (
        np.uint64(job_id & 0xFFFF) << np.uint64(32))
    with np.errstate(over="ignore"):  # splitmix64's finaliser: wrapping arithmetic
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x = x ^ (x >> np.uint64(31))
    copy = (x % np.uint64(2 * slots)).astype(np.int64)
    return base + copy % slots, copy // slots


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

    def samples(self, rtts: list[float]):
        """``sample`` each of ``rtts`` in turn."""
        srtt, rttvar = self.srtt, self.rttvar
        for rtt in rtts:
            if srtt is None:
                srtt, rttvar = rtt, rtt / 2
            else:
                rttvar = 0.75 * rttvar + 0.25 * abs(srtt - rtt)
                srtt = 0.875 * srtt + 0.125 * rtt
        self.srtt, self.rttvar = srtt, rttvar
        self.rto = min(self.rto_max, max(self.rto_min, srtt + 4 * rttvar))
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

    def on_result(self, count: int = 1):
        """``count`` results arrived."""
        for _ in range(count):
            if self.cwnd < self.ssthresh:
                self.cwnd += 1
            else:
                self.cwnd += 1 / self.cwnd
            if self.cwnd >= self.limit:
                self.cwnd = float(self.limit)
                break

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
    wakeups: int = 0  # times the stream woke up to take results
    lingered_s: float = 0.0  # seconds it waited for results to gather (``linger``)


class StreamStalled(RuntimeError):
    """No result arrived for too long."""


class SlotStream:
    """A worker's stream of chunks through its job's slots on the aggregator."""

    def __init__(self, sock: socket.socket, aggregator: tuple[str, int], job_id: int,
                 worker: int, slot_base: int, slots: int, rto_min: float, rto_max: float,
                 stall_timeout: float, words: int = QAINA_WORDS,
                 shared: tuple[int, int] | None = None):
        self.sock = sock
        #: --allocation shared: the region (first slot, slots) chunks are hashed onto;
        #: None: chunk k uses the job's own slot ``slot_base + k % slots``
        self.shared = shared
        self.wire = wire(words)
        self.words = words  # payload words per chunk (the switch's build)
        self.packet_len = self.wire.datagram_len  # UDP payload of one chunk
        self.dest = aggregator
        self.job_id = job_id
        self.worker = worker
        self.slot_base = slot_base
        self.slots = slots
        self.stall_timeout = stall_timeout
        self.rtt = RttEstimator(rto_min, rto_max)
        self.window = CongestionWindow(slots)
        self.position = 0  # sequence number of the next chunk in the job's stream
        self.min_batch = max(1, slots // 4)  # chunks encoded and sent together
        self._poll = select.poll()
        self._poll.register(sock, select.POLLIN)
        self._rx = _Receiver(self.wire)
        #: the first header word of this worker's results, under _LEAD_MASK
        self.lead = np.uint32(job_id << 16 | worker << 8 | FLAG_RESULT)

    def datagrams(self, n: int, exps: np.ndarray) -> np.ndarray:
        """Chunks ``position .. position + n - 1`` as QAINA datagrams (``wire.dtype``)
        with every header field set; the payload words are left to the encoder."""
        k = self.position + np.arange(n, dtype=np.int64)
        d = np.zeros(n, dtype=self.wire.dtype)
        d["job_id"] = self.job_id
        d["worker"] = self.worker
        if self.shared is None:
            d["slot"] = self.slot_base + k % self.slots
            d["ver"] = (k // self.slots) % 2
        else:
            d["slot"], d["ver"] = placement(self.job_id, k, *self.shared)
        d["exp"] = exps
        d["seq"] = k & 0xFFFFFFFF
        return d

    def exchange(self, exps: np.ndarray, encode):
        """Send ``len(exps)`` chunks, chunk ``c`` carrying exponent ``exps[c]``, and
        collect their results.

        ``encode(a, b, agreed, words)`` fills ``words[a:b]`` (payload words of chunks
        ``a .. b-1``, a view of the datagrams) just before they go out; ``agreed``
        holds the exponents the results brought so far (the result of chunk ``c``
        arrives before chunk ``c + slots`` is encoded).
        Returns (result words as big-endian >u4 [n, words], agreed exponents [n], stats).
        """
        run = _Exchange(self, self.datagrams(len(exps), exps), encode)
        run.loop()
        self.position += len(exps)
        return run.results, run.agreed, run.stats


def coalesce_delay(got: int, batch: int, in_flight: int, gap: float, limit: float,
                   timer: float | None, now: float) -> float:
    """Seconds to wait for more results after ``got`` came in one wakeup: 0 for a
    batch or more, or when fewer than the missing ones are outstanding; else the
    missing ones' share of ``gap`` (seconds between results), at most ``limit`` and
    never past the retransmission ``timer``."""
    missing = batch - got
    if missing <= 0 or in_flight < missing:
        return 0.0
    delay = min(limit, gap * missing)
    if timer is not None:
        delay = min(delay, timer - now)
    return max(0.0, delay)


class _Receiver:
    """Datagrams read from the socket into rows of one array, parsed together."""

    BATCH = 256

    def __init__(self, w):
        self.rows = np.zeros(self.BATCH, dtype=w.dtype)
        stride = {"buffer": self.rows, "strides": (w.datagram_len,)}
        #: job_id, worker and flags of each row as one big-endian word; seq
        self.lead = np.ndarray((self.BATCH,), ">u4", offset=0, **stride)
        self.seq = np.ndarray((self.BATCH,), ">u4", offset=FIELD_OFFSETS["seq"], **stride)
        flat = memoryview(self.rows.view(np.uint8))
        self.views = [flat[i * w.datagram_len:(i + 1) * w.datagram_len]
                      for i in range(self.BATCH)]
        self.expected = w.datagram_len

    def drain(self, sock, source) -> tuple[int, int]:
        """Read what is ready; returns (rows filled with results from ``source`` of the
        right length, datagrams refused). A longer datagram is refused, not taken cut
        to a row (``MSG_TRUNC`` gives its whole length)."""
        recvfrom_into, expected = sock.recvfrom_into, self.expected
        kept = refused = 0
        views = self.views
        while kept < self.BATCH:
            try:
                size, sender = recvfrom_into(views[kept], 0, socket.MSG_TRUNC)
            except BlockingIOError:
                break
            if size != expected or sender != source:
                refused += 1
            else:
                kept += 1
        return kept, refused


class _Exchange:
    """The state of one ``SlotStream.exchange``: chunks in flight, results, timer.

    Per chunk, in arrays: when it was last sent, how often, how many results of later
    chunks arrived since, and whether its result is in. Results are taken in batches,
    as many as are ready.
    """

    def __init__(self, stream: SlotStream, datagrams: np.ndarray, encode):
        self.s = stream
        self.n = n = len(datagrams)
        self.d = datagrams
        self.encode = encode
        self.k0 = stream.position
        flat = memoryview(datagrams.view(np.uint8))
        size = stream.packet_len
        self.views = [flat[c * size:(c + 1) * size] for c in range(n)]
        self.results = np.zeros((n, stream.words), dtype=">u4")
        self.agreed = np.zeros(n, dtype=np.int8)
        self.got = np.zeros(n, dtype=bool)
        self.sent_at = np.zeros(n)
        self.sends = np.zeros(n, dtype=np.int32)
        self.later = np.zeros(n, dtype=np.int32)  # results of later chunks since the last send
        self.stats = ExchangeStats(first_send=time.time())
        self.next_c = 0  # chunks 0 .. next_c - 1 were sent
        self.low = 0  # every chunk below has its result
        self.done = 0
        self.timer: float | None = None  # when the retransmission timer expires
        self.last_progress = time.monotonic()
        self.windows = 0.0
        self.gap = 0.0  # seconds between results, mean (EWMA of 1/8)
        self.last_rx = self.last_progress

    @property
    def in_flight(self) -> int:
        """Chunks sent whose result is not in."""
        return self.next_c - self.done

    def loop(self):
        s = self.s
        poll = s._poll.poll
        while self.done < self.n:
            self.fill()
            now = time.monotonic()
            wait = 0.05 if self.timer is None else min(0.05, max(0.0, self.timer - now))
            if poll(wait * 1e3):
                self.stats.wakeups += 1
                self.linger(self.receive())
            now = time.monotonic()
            if self.timer is not None and now >= self.timer:
                self.expire(now)
            if self.done < self.n and now - self.last_progress > s.stall_timeout:
                raise StreamStalled(
                    f"no result for {s.stall_timeout:.0f} s with {self.in_flight} chunks "
                    f"outstanding (is the switch up, the job programmed, the route to "
                    f"{s.dest[0]} there?)")
        sent = self.stats.packets_sent - self.stats.retransmissions
        self.stats.window_mean = self.windows / sent if sent else 0.0

    def sendable(self) -> int:
        """How many chunks from ``next_c`` on the window and the slots let go now."""
        s, c = self.s, self.next_c
        k = min(self.n - c, s.window.allowed - self.in_flight)
        if k <= 0:
            return 0
        S = s.slots
        if c + k > S:  # chunk c + i reuses the slot of c + i - S: its result must be in
            lo = max(c, S)
            free = self.got[lo - S:c + k - S]
            if not free.all():
                k = lo - c + int(np.argmin(free))
        return k

    def fill(self):
        """Encode and send the chunks the window and the slots allow, together once
        enough are free (or the stream's last ones)."""
        k = self.sendable()
        batch = min(self.s.min_batch, max(1, self.s.window.allowed // 2))
        if k <= 0 or (k < batch and self.next_c + k < self.n and self.in_flight > 0):
            return
        a, b = self.next_c, self.next_c + k
        self.encode(a, b, self.agreed, self.d["words"])
        now = time.monotonic()
        self.windows += self.s.window.allowed * k
        self.sent_at[a:b] = now
        self.sends[a:b] = 1
        self.next_c = b
        self.send(range(a, b))
        if self.timer is None:
            self.timer = now + self.s.rtt.rto

    def send(self, chunks):
        """The datagrams of ``chunks``; a full or lossy egress queue (ENOBUFS) is a
        lost packet."""
        sendto, views, dest = self.s.sock.sendto, self.views, self.s.dest
        errors = 0
        for c in chunks:
            try:
                sendto(views[c], dest)
            except OSError as exc:
                if exc.errno not in (errno.ENOBUFS, errno.EAGAIN):
                    raise
                errors += 1
        self.stats.packets_sent += len(chunks)
        self.stats.send_errors += errors

    def resend(self, chunks, now: float):
        """Chunks sent before go again, flagged as retransmissions."""
        if not len(chunks):
            return
        self.d["flags"][chunks] |= FLAG_RETX
        self.sent_at[chunks] = now
        self.sends[chunks] += 1
        self.later[chunks] = 0
        chunks = chunks.tolist()
        self.stats.retransmissions += len(chunks)
        self.send(chunks)
        for c in chunks:
            self.s.window.on_loss(c, self.next_c)

    def linger(self, got: int):
        """``got`` results just came in: wait for the rest of a batch if results
        trickle and the rest is on the way (receive coalescing, above)."""
        if not got or not COALESCE:
            return
        now = time.monotonic()
        self.gap += ((now - self.last_rx) / got - self.gap) / 8
        self.last_rx = now
        limit = max(COALESCE_MAX, COALESCE_SHARE * (self.s.rtt.srtt or 0.0))
        delay = coalesce_delay(got, self.s.min_batch, self.in_flight, self.gap, limit,
                               self.timer, now)
        if delay > 0:
            time.sleep(delay)
            self.stats.lingered_s += delay

    def receive(self) -> int:
        """Take the results that are ready; returns how many were new."""
        s, stats, rx = self.s, self.stats, self.s._rx
        kept, refused = rx.drain(s.sock, s.dest)
        stats.refused += refused
        if not kept:
            return 0
        # job_id, worker and the result flag in one word: results for this worker only
        ok = (rx.lead[:kept] & _LEAD_MASK) == s.lead
        c = rx.seq[:kept].astype(np.int64)
        c -= self.k0
        c &= 0xFFFFFFFF
        results = int(np.count_nonzero(ok))
        stats.refused += kept - results
        stats.packets_received += results
        ok &= c < self.next_c  # only chunks sent: a result for another is a duplicate
        idx = np.flatnonzero(ok)
        chunks = c[idx]
        fresh = ~self.got[chunks]
        if not fresh.all():
            idx, chunks = idx[fresh], chunks[fresh]
        if len(chunks) > 1 and not (np.diff(chunks) > 0).all():
            chunks, first = np.unique(chunks, return_index=True)
            idx = idx[first]
        stats.duplicates += results - len(chunks)  # chunks done before, or twice in the batch
        if not len(chunks):
            return 0
        self._take(chunks, rx.rows[idx])
        return len(chunks)

    def _take(self, chunks: np.ndarray, rows: np.ndarray):
        """The results ``rows`` of ``chunks`` (new, ascending) are in."""
        s, now = self.s, time.monotonic()
        once = chunks[self.sends[chunks] == 1]  # Karn's rule
        if len(once):
            rtts = (now - self.sent_at[once]).tolist()
            self.stats.rtts.extend(rtts)
            s.rtt.samples(rtts)
        self.results[chunks] = rows["words"]
        self.agreed[chunks] = rows["exp"]
        self.got[chunks] = True
        self.done += len(chunks)
        if chunks[0] == self.low:
            self.low = self.next_c if self.done == self.next_c else (
                self.low + int(np.argmin(self.got[self.low:self.next_c])))
        self.last_progress = now
        s.window.on_result(len(chunks))
        self.timer = now + s.rtt.rto if self.done < self.next_c else None
        self._fast_retransmit(chunks, now)

    def _fast_retransmit(self, new: np.ndarray, now: float):
        """Chunks still outstanding for which ``DUP_THRESHOLD`` results of chunks sent
        after them have now arrived go again at once."""
        if self.low >= self.next_c:
            return
        top = int(new[-1])
        waiting = self.low + np.flatnonzero(~self.got[self.low:min(top, self.next_c)])
        if not len(waiting):
            return
        before = self.later[waiting]
        after = before + len(new) - np.searchsorted(new, waiting, side="right")
        self.later[waiting] = after
        fire = waiting[(before < DUP_THRESHOLD) & (after >= DUP_THRESHOLD)]
        self.stats.fast_retransmits += len(fire)
        self.resend(fire, now)

    def expire(self, now: float):
        """The retransmission timer fired: resend what waited an RTO, back off."""
        stats, rto = self.stats, self.s.rtt.rto
        stats.timeouts += 1
        waiting = self.low + np.flatnonzero(~self.got[self.low:self.next_c])
        if len(waiting):
            late = now - self.sent_at[waiting] >= rto
            late[0] = True  # the oldest outstanding chunk always goes
            self.resend(waiting[late], now)
        self.s.rtt.backoff()
        self.timer = now + self.s.rtt.rto if self.done < self.next_c else None
