"""Collective modes: how a job's workers sum an iteration, and what the harness must
provide for it. ``MODES`` is their registry (entry-point group ``qaina_bench.modes``).

A mode is a ``Mode``: data for the harness, and a factory of the agent's ``Collective``.

**The host side, ``Collective``.** Every agent builds one with
``mode.collective(cfg, log)`` (``cfg``: its ``AgentConfig``; ``log(**record)`` writes a
record to its JSON-lines file) and calls, in this order:

* ``connect(timeout)`` once, before it reports that it started (TCP peers connect here);
* ``start(signal)`` once, with the start signal's contents (``{}``, or
  ``{"slot_base": N}`` for a job the harness admitted on arrival);
* ``all_reduce(values, codec, predicted)`` once per iteration: ``values`` are this
  worker's (``hosts/pipeline.py`` steps 1-3), ``codec`` its ``WorkerCodec`` for them,
  ``predicted`` the scale codes of the first P chunks (None: none predicted). It
  quantizes, sums over the job's workers, dequantizes, and returns an ``Aggregated``:
  the dequantized sum, this worker's levels, the scales used, and, for a mode that
  predicts scales, the agreed maxima of the first P chunks (``next_scales``) that
  predict the next iteration's;
* ``close()`` at the end, whatever happened.

``bytes_sent``, ``bytes_received`` and ``retransmissions`` count what it did so far.
Errors that end the run are ``CollectiveError`` (or ``RingError``, ``PSError``).

**The built-in modes.** ``ina``: through the switch's slots (``SwitchCollective``, over
``transport.SlotStream``); ``ring``: ring all-reduce between the workers
(``ring.Ring``); ``ps``: a parameter server on a host of its own (``ps.PSClient``). Ring
and parameter server are a ``HostCollective`` over a ``transport`` that has
``connect(timeout)``, ``all_reduce(array, ufunc)`` (in place, ``np.maximum`` or
``np.add``), the byte and retransmission counters and ``close()``; a new host-based
collective (a tree, all-to-all) needs only such a transport.

**The harness side** is data on the ``Mode`` (the harness reads it; nothing here
imports the harness): ``in_switch`` (aggregates in the switch: the job holds slots, and
``--levels 2`` and ``--allocation shared`` apply), ``server`` (one extra host per job
and the program it runs there), ``float_sums`` (can sum float32: ``--quantizer none``).
A job's summary fields that only in-switch modes have (slots, registers) are the metric
registry's (``harness/results/metrics.py``), from ``in_switch``.
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..p4.header import wire
from ..plugins import Registry
from .compression import WorkerCodec
from .pipeline import Aggregated
from .ps import PS_PORT, PSClient
from .ring import Ring
from .transport import ExchangeStats, SlotStream, StreamStalled


class CollectiveError(RuntimeError):
    """The collective cannot go on (no progress, a bad configuration)."""


class Collective:
    """How a worker sums one iteration's values over its job (the interface: see the
    module docstring)."""

    bytes_sent = 0
    bytes_received = 0
    retransmissions = 0
    tcp_congestion: str | None = None  # the TCP congestion control of its connections

    def connect(self, timeout: float):
        """Reach the job's peers or servers; nothing to do by default."""

    def start(self, signal: dict):
        """The start signal's contents; nothing to do by default."""

    def all_reduce(self, values: np.ndarray, codec: WorkerCodec,
                   predicted: np.ndarray | None) -> Aggregated:
        raise NotImplementedError

    def close(self):
        """Release sockets; nothing to do by default."""


class HostCollective(Collective):
    """Summed by the hosts over a ``transport`` (a ``Ring`` or a ``PSClient``): a max
    all-reduce agrees every chunk's scale exactly, then the packed words are summed with
    wrapping addition, as the switch would; ``float_sums`` sums the float32 values."""

    def __init__(self, transport, float_sums: bool = False):
        self.transport = transport
        self.float_sums = float_sums

    def connect(self, timeout: float):
        self.transport.connect(timeout=timeout)

    bytes_sent = property(lambda self: self.transport.bytes_sent)
    bytes_received = property(lambda self: self.transport.bytes_received)
    retransmissions = property(lambda self: self.transport.retransmissions)  # TCP's
    tcp_congestion = property(lambda self: self.transport.tcp_congestion)

    def all_reduce(self, values, codec, predicted=None) -> Aggregated:
        n = len(values)
        stats = ExchangeStats(first_send=time.time())
        sent0, received0, retx0 = self.bytes_sent, self.bytes_received, self.retransmissions
        if self.float_sums:
            total = self.transport.all_reduce(values.astype(np.float32), np.add)
            none = np.zeros(0, dtype=np.int32)
            a = Aggregated(total, none, none, none.astype(np.int8), None, None, stats, 0.0, 0, 0)
        else:
            scale = self.transport.all_reduce(codec.codes(values), np.maximum)
            t = time.perf_counter()
            levels = codec.quantize(values, scale)
            words = codec.fmt.pack(levels, len(scale) * (codec.chunk_elems // codec.fmt.lanes))
            encode_s = time.perf_counter() - t
            self.transport.all_reduce(words, np.add)
            sums = codec.fmt.unpack_sum(words, n)
            total = codec.dequantize_sum(sums, scale)
            a = Aggregated(total, levels, sums, scale, None, None, stats, encode_s, 0, 0)
        stats.bytes_sent = self.bytes_sent - sent0
        stats.bytes_received = self.bytes_received - received0
        stats.retransmissions = self.retransmissions - retx0
        return a

    def close(self):
        self.transport.close()


class SwitchCollective(Collective):
    """Summed in the switch: the chunks stream through the job's slots (``SlotStream``).

    Scale agreement without a blocking round trip (hosts/agent.py's docstring): chunk
    ``c`` carries the exponent of chunk ``c + P``, the last P those of the next
    iteration's first P; the first P chunks use ``predicted`` scales. Without them a
    warm-up round of P zero chunks first brings the true maxima of the first P.
    """

    def __init__(self, cfg, log: Callable):
        self.log = log
        self.wire = wire(cfg.run.network.payload_words)
        self.window = cfg.slots
        self.record_levels = cfg.run.output.record_levels
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
        self.sock.bind(("0.0.0.0", cfg.port))
        self.sock.setblocking(False)
        index = cfg.worker if cfg.wire_worker is None else cfg.wire_worker
        self.stream = SlotStream(self.sock, (cfg.aggregator, cfg.port), cfg.job_id, index,
                                 cfg.slot_base, cfg.slots, cfg.rto_min, cfg.rto_max,
                                 cfg.stall_timeout, cfg.run.network.payload_words,
                                 (cfg.shared_base, cfg.shared_slots) if cfg.shared_slots
                                 else None)

    def start(self, signal: dict):
        if "slot_base" in signal:  # a job admitted on arrival learns its slots here
            self.stream.slot_base = int(signal["slot_base"])

    def predicted_count(self, chunks: int) -> int:
        """P: chunks at the start of an iteration whose scale comes from the last one."""
        return min(self.window, chunks)

    def _exchange(self, exps: np.ndarray, encode):
        try:
            words, agreed, stats = self.stream.exchange(exps, encode)
        except StreamStalled as exc:
            raise CollectiveError(str(exc)) from None
        self.bytes_sent += stats.packets_sent * self.wire.frame_len
        self.bytes_received += stats.packets_received * self.wire.frame_len
        self.retransmissions += stats.retransmissions
        return words, agreed, stats

    def warm_up(self, values: np.ndarray, codec: WorkerCodec) -> np.ndarray:
        """Zero chunks carrying the first P exponents of ``values``; returns their maxima."""
        own = codec.codes(values)
        zero = codec.fmt.pack(np.zeros(codec.chunk_elems, dtype=np.int32), self.wire.words)

        def encode(a, b, agreed, words):
            words[a:b] = zero

        _, agreed, stats = self._exchange(own[:self.predicted_count(len(own))], encode)
        self.log(type="warmup", start=stats.first_send, end=time.time(),
                 packets_sent=stats.packets_sent, retransmissions=stats.retransmissions,
                 refused=stats.refused)
        return agreed

    def all_reduce(self, values, codec, predicted) -> Aggregated:
        """Chunks are quantized and packed in batches, as the window lets them go."""
        if predicted is None:
            predicted = self.warm_up(values, codec)
        n, ce = len(values), codec.chunk_elems
        own = codec.codes(values)
        C = len(own)
        P, W = self.predicted_count(C), self.window
        scale = np.zeros(C, dtype=np.int8)
        scale[:P] = predicted
        keep = codec.error_feedback or self.record_levels  # this worker's levels
        levels = np.zeros(n if keep else 0, dtype=np.int32)
        encode_s = [0.0]

        def encode(a, b, agreed, words):
            t = time.perf_counter()
            lo = max(a, P)
            if b > lo:  # the results of chunks lo - W .. b - W - 1 brought exact maxima
                scale[lo:b] = agreed[lo - W:b - W]
            part = slice(a * ce, min(b * ce, n))
            codec.quantize_into(values[part], scale[a:b], words[a:b],
                                levels[part] if keep else None)
            encode_s[0] += time.perf_counter() - t

        words_back, agreed, stats = self._exchange(np.roll(own, -P), encode)
        sums = np.zeros(n if self.record_levels else 0, dtype=np.int64)
        total = codec.dequantize_words(words_back, scale, n,
                                       sums if self.record_levels else None)
        # The last P results carry the true maxima of the first P chunks: how many of
        # their predicted scales fell short is known alike to every worker.
        short = int(np.count_nonzero(agreed[C - P:] > scale[:P]))
        # Only predicted scales can clip: every later chunk's scale is the maximum of
        # the workers' own.
        clipped = codec.clipped(values[:P * ce], scale[:P])
        return Aggregated(total, levels, sums, scale, agreed[C - P:], int(agreed.max()), stats,
                          encode_s[0], clipped, short)

    def close(self):
        self.sock.close()


@dataclass(frozen=True)
class ServerHost:
    """The host a mode adds to every job (after its workers) and what runs there:
    ``python -m MODULE PORT WORKERS CONGESTION``, serving until the job's workers are
    done (CONGESTION: the run's TCP congestion control, ``--tcp-cc``)."""

    label: str  # what it is called in messages: "parameter server"
    short: str  # process names (ps1, ps2, ...) and its CPU component
    module: str
    port: int

    def argv(self, workers: int, congestion: str | None) -> list[str]:
        return ["-m", self.module, str(self.port), str(workers)] + (
            [congestion] if congestion else [])


@dataclass(frozen=True)
class Mode:
    """A collective mode: the agent's collective, and what the harness provides for it."""

    description: str  # how the job's workers aggregate, in a few words
    collective: Callable  # (AgentConfig, log) -> Collective
    in_switch: bool = False  # the switch sums: slots, --levels 2, --allocation shared
    server: ServerHost | None = None  # an extra host per job, running a server
    float_sums: bool = False  # can sum float32 (--quantizer none at --bits 32)
    connect_note: str = ""  # what the agents do before they report they started


MODES: Registry[Mode] = Registry("mode", "qaina_bench.modes")


def congestion_asked(run) -> str | None:
    """The TCP congestion control a run's baselines use (``--tcp-cc``; None: each
    host's default)."""
    return None if run.network.tcp_cc == "system" else run.network.tcp_cc


def _ring(cfg, log) -> Collective:
    if not cfg.ring_peers or len(cfg.ring_peers) != cfg.run.workload.workers:
        raise CollectiveError("ring mode needs the addresses of all the job's workers")
    return HostCollective(Ring(cfg.worker, [(a, cfg.ring_port) for a in cfg.ring_peers],
                               congestion_asked(cfg.run)),
                          cfg.run.compression.quantizer == "none")


def _ps(cfg, log) -> Collective:
    if not cfg.ps_address:
        raise CollectiveError("ps mode needs the address of the job's parameter server")
    return HostCollective(PSClient(cfg.worker, (cfg.ps_address, cfg.ps_port),
                                   congestion_asked(cfg.run)),
                          cfg.run.compression.quantizer == "none")


MODES.add("ina", Mode("in the switch's slots", SwitchCollective, in_switch=True))
MODES.add("ring", Mode("ring all-reduce", _ring, float_sums=True,
                       connect_note="they connect to their ring neighbours over TCP first: "
                       "with heavy --loss that can take long"))
MODES.add("ps", Mode("parameter server", _ps, float_sums=True,
                     server=ServerHost("parameter server", "ps", "qaina_bench.hosts.ps",
                                       PS_PORT),
                     connect_note="they connect to their parameter server over TCP first"))
