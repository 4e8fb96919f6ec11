"""The worker agent: one process per worker host.

For every iteration of its gradient trace the agent quantizes the flattened gradient,
packs the levels into lanes, streams the chunks to the job's aggregator with a window
of outstanding slots (self-clocked by the results, as in SwitchML), retransmits on
timeout, receives the aggregated words, unpacks and dequantizes them, and records
per-iteration timings, bytes, retransmissions and the aggregation error against the
exact fp32 sum of all workers' trace gradients.

Scale agreement, with no blocking round trip per chunk (see p4/README.md). Every
packet carries one exponent; the switch keeps the maximum over the workers and returns
it with the result. With a window of W slots and C chunks per iteration, P = min(W, C):

* chunk ``c < C - P`` carries the sender's exponent of chunk ``c + P``; chunk ``c + P``
  (= ``c + W``) reuses the slot and is sent only after that result is in, so it is
  quantized with the exact maximum;
* the last P chunks carry the exponents of this iteration's first P chunks: their
  maxima, plus ``headroom`` steps, are the predicted scales of the next iteration's
  first P chunks (values beyond a predicted scale are clipped, and counted);
* before iteration 0, a warm-up round of P zero chunks carries iteration 0's first P
  exponents, so iteration 0 uses exact scales throughout.

GradiVeQ (``compress="gradiveq"``, hosts/gradiveq.py): the first ``gvq_fit``
iterations, and with ``gvq_refresh`` = R every (R + 1)-th after them, are aggregated
uncompressed at 32 bits (exact data); every worker fits the same per-layer bases to
the identical aggregates it received (no extra communication), and the other
iterations aggregate the coefficients of every ``d``-element slice of the large
layers and the small layers as they are, quantized to the job's bits: the
compression is linear, so the switch's sum of coefficients is the coefficients of
the sum, which the agent decompresses.

Ring mode (``mode="ring"``) is the host-based baseline: the same quantization and lanes,
summed by ring all-reduce between the workers over the same fabric (``ring.py``).

Run: ``python -m qaina_bench.hosts.agent CONFIG.json`` (the harness writes the config).
"""

from __future__ import annotations

import json
import os
import resource
import signal
import statistics
import socket
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ..p4.header import QAINA_UDP_PORT, wire
from . import kernels
from .ps import PS_PORT, PSClient, PSError
from .ring import Ring, RingError
from .compression import COMPRESSORS, CodecConfig, WorkerCodec
from .sources import LiveTraining, TraceReplay
from ..settings import ConfigError, Settings
from .traces import TraceError
from .transport import ExchangeStats, SlotStream, StreamStalled
DEFAULT_HEADROOM = 1  # predicted scales x2 for b <= 8
DEFAULT_HEADROOM_32 = 8  # x256 for the 32-bit fixed point


@dataclass
class AgentConfig:
    """Everything one agent needs: the run's configuration tree (``settings.py``) and
    this agent's own part; written by the harness as JSON."""

    run: Settings
    job_id: int
    worker: int
    bits: int  # the job's bit width
    trace: str  # path of the trace set ("" when the run trains)
    aggregator: str  # IPv4 address of the job's aggregating switch
    slot_base: int
    slots: int  # window: slots of the job's range this agent cycles through
    output: str  # JSON-lines file of per-iteration records
    trace_worker: int | None = None  # which trace worker to replay (default: worker)
    shared_slots: int = 0  # --allocation shared: chunks hashed onto slots shared_base..
    shared_base: int = 0  # .. shared_base + shared_slots - 1 (0 slots: the job's range)
    wire_worker: int | None = None  # index in its packets if not ``worker`` (two levels)
    start_file: str | None = None  # start once this file exists; it may hold {"slot_base": N}
    start_timeout: float = 120.0
    ring_peers: list | None = None  # ring mode: the job's workers' addresses, in order
    ps_address: str | None = None  # ps mode: the job's parameter server
    port: int = QAINA_UDP_PORT
    ring_port: int = 20802
    ps_port: int = PS_PORT
    rto_min: float = 0.1  # scheduling stalls of tens of ms are normal on a shared 2-core box
    rto_max: float = 1.0
    stall_timeout: float = 30.0

    @classmethod
    def load(cls, path) -> "AgentConfig":
        data = json.loads(Path(path).read_text())
        if not isinstance(data, dict) or not isinstance(data.get("run"), dict):
            raise ConfigError(f"{path}: an agent configuration holds the run's tree "
                              "under 'run'")
        run = Settings.from_dict(data.pop("run"), f"{path}: run")
        return cls(run=run, **data)

    def save(self, path):
        Path(path).write_text(json.dumps(asdict(self), indent=1))


class AgentError(RuntimeError):
    """The agent cannot go on (no progress, bad configuration)."""


@dataclass
class Aggregated:
    """What aggregating one vector over the job's workers gave this worker."""

    total: np.ndarray  # the dequantized sum
    levels: np.ndarray  # this worker's quantized levels
    sums: np.ndarray  # the integer level sums received
    scale: np.ndarray  # the exponent of every chunk
    next_scales: np.ndarray | None  # agreed maxima for the next iteration's first chunks
    top: int | None  # the largest exponent agreed
    stats: ExchangeStats
    encode_s: float
    clipped: int  # values beyond their chunk's scale (clipped to it)
    short: int  # predicted scales below their chunk's true maximum (the same for all)


class Agent:
    """One worker: its gradients (a trace replayed, or training) aggregated through
    the switch or the ring."""

    def __init__(self, cfg: AgentConfig):
        self.cfg = cfg
        work, comp, words = cfg.run.workload, cfg.run.compression, cfg.run.network.payload_words
        try:
            self.wire = wire(words)
            if comp.quantizer == "none" and (work.mode == "ina" or cfg.bits != 32):
                raise ValueError("quantizer none (float32 sums) is for --mode ring or ps at "
                                 "32 bits")
            self.float = comp.quantizer == "none"
            self.codec = WorkerCodec(CodecConfig(cfg.bits, work.workers,
                                                 "maxpow2" if self.float else comp.quantizer,
                                                 comp.bucket, comp.error_feedback, comp.headroom,
                                                 comp.pack),
                                     np.random.default_rng([work.seed, cfg.job_id, cfg.worker]),
                                     words)
        except ValueError as exc:
            raise AgentError(str(exc)) from None
        self.fmt = self.codec.fmt
        try:
            if cfg.run.training.train:
                t = cfg.run.training
                self.source = LiveTraining(cfg.worker, work.workers, work.iterations,
                                           t.model, work.seed, t.lr, t.batch_size,
                                           tuple(t.hidden), t.width, t.eval_every)
            else:
                self.source = TraceReplay(cfg.trace, cfg.worker if cfg.trace_worker is None
                                          else cfg.trace_worker, work.workers, work.iterations)
        except (ValueError, TraceError) as exc:
            raise AgentError(str(exc)) from None
        self.elements = self.source.elements
        self.gvq = None  # the compressor (--compress), GradiVeQ's by default
        if comp.compress != "none":
            try:
                self.gvq = COMPRESSORS.get(comp.compress)(
                    self.source.layers, d=comp.gvq_d, k=comp.gvq_k,
                    fit=comp.gvq_fit, refresh=comp.gvq_refresh)
            except ValueError as exc:
                raise AgentError(f"--compress {comp.compress}: {exc}") from None
            # Exact iterations: 32-bit fixed point, whatever the job's bits.
            self.exact_codec = WorkerCodec(CodecConfig(32, work.workers), np.random.default_rng(
                [work.seed, cfg.job_id, cfg.worker, 32]), words)
        if work.mode not in ("ina", "ring", "ps"):
            raise AgentError(f"unknown mode {work.mode!r}: ina, ring or ps")
        self.ring = None  # the host-based collective of ring and ps modes
        if work.mode == "ring":
            if not cfg.ring_peers or len(cfg.ring_peers) != work.workers:
                raise AgentError("ring mode needs the addresses of all the job's workers")
            self.ring = Ring(cfg.worker, [(a, cfg.ring_port) for a in cfg.ring_peers])
        elif work.mode == "ps":
            if not cfg.ps_address:
                raise AgentError("ps mode needs the address of the job's parameter server")
            self.ring = PSClient(cfg.worker, (cfg.ps_address, cfg.ps_port))
        self.window = cfg.slots
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
        self.sock.bind(("0.0.0.0", cfg.port))
        self.sock.setblocking(False)
        index = cfg.worker if cfg.wire_worker is None else cfg.wire_worker
        self.stream = SlotStream(self.sock, (cfg.aggregator, cfg.port), cfg.job_id, index,
                                 cfg.slot_base, cfg.slots, cfg.rto_min, cfg.rto_max,
                                 cfg.stall_timeout, words,
                                 (cfg.shared_base, cfg.shared_slots) if cfg.shared_slots
                                 else None)
        self.out = open(cfg.output, "w", buffering=1)
        self.levels_record: dict[str, np.ndarray] = {}

    def _exchange(self, exps: np.ndarray, encode):
        try:
            return self.stream.exchange(exps, encode)
        except StreamStalled as exc:
            raise AgentError(str(exc)) from None

    # -- iterations --------------------------------------------------------------------
    def exact_iteration(self, i: int) -> bool:
        """Whether iteration ``i`` is one GradiVeQ aggregates uncompressed at 32 bits."""
        return self.gvq is not None and self.gvq.exact(i)

    def codec_for(self, i: int) -> WorkerCodec:
        return self.exact_codec if self.exact_iteration(i) else self.codec

    def predicted_count(self, chunks: int) -> int:
        """P: chunks at the start of an iteration whose scale comes from the last one."""
        return min(self.window, chunks)

    def carried(self, own: np.ndarray) -> np.ndarray:
        """The exponent every chunk carries to the switch (see the module docstring):
        chunk ``c`` that of chunk ``c + P``, the last P those of the first P."""
        return np.roll(own, -self.predicted_count(len(own)))

    def warm_up(self, values: np.ndarray, codec: WorkerCodec) -> np.ndarray:
        """Zero chunks carrying the first P exponents of ``values``; returns their maxima.

        Runs before iteration 0, and again whenever the aggregated vector changes shape
        or format (GradiVeQ switching between gradients and coefficients).
        """
        own = codec.codes(values)
        zero = codec.fmt.pack(np.zeros(codec.chunk_elems, dtype=np.int32), self.wire.words)

        def encode(a, b, agreed, words):
            words[a:b] = zero

        _, agreed, stats = self._exchange(own[:self.predicted_count(len(own))], encode)
        self._emit(type="warmup", start=stats.first_send, end=time.time(),
                   packets_sent=stats.packets_sent, retransmissions=stats.retransmissions,
                   refused=stats.refused)
        return agreed

    def aggregate(self, values: np.ndarray, predicted: np.ndarray,
                  codec: WorkerCodec) -> Aggregated:
        """Sum ``values`` over the job's workers through the switch.

        ``predicted`` are the scales of the first P chunks. Chunks are quantized and
        packed in batches, as the window lets them go.
        """
        n = len(values)
        ce = codec.chunk_elems
        own = codec.codes(values)
        C = len(own)
        P, W = self.predicted_count(C), self.window
        scale = np.zeros(C, dtype=np.int8)
        scale[:P] = predicted
        keep = codec.error_feedback or self.cfg.run.output.record_levels  # this worker's levels
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

        words_back, agreed, stats = self._exchange(self.carried(own), encode)
        sums = np.zeros(n if self.cfg.run.output.record_levels else 0, dtype=np.int64)
        total = codec.dequantize_words(words_back, scale, n,
                                       sums if self.cfg.run.output.record_levels else None)
        # The last P results carry the true maxima of the first P chunks: how many of
        # their predicted scales fell short is known alike to every worker.
        short = int(np.count_nonzero(agreed[C - P:] > scale[:P]))
        # Only predicted scales can clip: every later chunk's scale is the maximum of
        # the workers' own.
        clipped = codec.clipped(values[:P * ce], scale[:P])
        return Aggregated(total, levels, sums, scale, agreed[C - P:], int(agreed.max()), stats,
                          encode_s[0], clipped, short)

    def ring_aggregate(self, values: np.ndarray, codec: WorkerCodec) -> Aggregated:
        """``aggregate`` by the host-based collective (ring or parameter server): a max
        all-reduce agrees every chunk's scale exactly, then the packed words are summed
        with wrapping addition; fp32 (quantizer none) sums the float32 values."""
        n = len(values)
        stats = ExchangeStats(first_send=time.time())
        sent0, received0 = self.ring.bytes_sent, self.ring.bytes_received
        retx0 = self.ring.retransmissions
        if self.float:
            total = self.ring.all_reduce(values.astype(np.float32), np.add)
            none = np.zeros(0, dtype=np.int32)
            a = Aggregated(total, none, none, none.astype(np.int8), None, None, stats, 0.0, 0, 0)
        else:
            scale = self.ring.all_reduce(codec.codes(values), np.maximum)
            t = time.perf_counter()
            levels = codec.quantize(values, scale)
            words = codec.fmt.pack(levels, len(scale) * self.wire.words)
            encode_s = time.perf_counter() - t
            self.ring.all_reduce(words, np.add)
            sums = codec.fmt.unpack_sum(words, n)
            total = codec.dequantize_sum(sums, scale)
            a = Aggregated(total, levels, sums, scale, None, None, stats, encode_s, 0, 0)
        stats.bytes_sent = self.ring.bytes_sent - sent0
        stats.bytes_received = self.ring.bytes_received - received0
        stats.retransmissions = self.ring.retransmissions - retx0  # the kernel's, TCP
        return a

    def iteration(self, i: int, predicted: np.ndarray | None):
        """Aggregate iteration ``i``: compressed with GradiVeQ but for its exact
        iterations, which fit or refresh the bases.

        ``predicted`` are the scales of the first P chunks (None: run a warm-up first).
        """
        cpu0 = time.process_time()
        grad = self.source.gradient(i)
        codec = self.codec_for(i)
        t0 = time.perf_counter()
        compressed = self.gvq is not None and not self.exact_iteration(i)
        values = codec.values(self.gvq.compress(grad) if compressed else grad)
        compress_s = time.perf_counter() - t0
        if self.ring is not None:
            a = self.ring_aggregate(values, codec)
        else:
            if predicted is None:
                predicted = self.warm_up(values, codec)
            a = self.aggregate(values, predicted, codec)
        t1 = time.perf_counter()
        if not self.float:
            codec.book(values, a.levels, a.scale)
        aggregate = self.gvq.decompress(a.total) if compressed else a.total
        end = time.time()
        decode_s = time.perf_counter() - t1
        if self.gvq is not None and not compressed:
            self.gvq.learn(aggregate, i)
        exact = self.source.exact(i)
        err = None if exact is None else float(kernels.relative_error(aggregate, exact))
        learned = self.source.apply(i, aggregate)
        if self.cfg.run.output.record_levels:
            self.levels_record[f"levels_{i}"] = a.levels
            self.levels_record[f"sums_{i}"] = a.sums.astype(np.int64)
            self.levels_record[f"aggregate_{i}"] = a.total
            self.levels_record[f"scale_{i}"] = a.scale
            self.levels_record[f"bits_{i}"] = np.array(codec.fmt.bits)
        learned["cpu_s"] = time.process_time() - cpu0
        self._record_iteration(i, a, values, compressed, end, err, compress_s, decode_s,
                               codec, learned)
        return a

    def _record_iteration(self, i: int, a: Aggregated, values, compressed: bool, end: float,
                          err: float | None, compress_s: float, decode_s: float,
                          codec: WorkerCodec, learned: dict):
        stats, rtts = a.stats, a.stats.rtts
        gvq = {} if self.gvq is None else self.gvq.metrics(self.source.exact(i))
        self._emit(type="iteration", iteration=i, start=stats.first_send, end=end,
                   completion_s=end - stats.first_send, elements=self.elements,
                   values=len(values), compressed=compressed, chunks=len(a.scale),
                   packets_sent=stats.packets_sent, packets_received=stats.packets_received,
                   bytes_sent=stats.bytes_sent or stats.packets_sent * self.wire.frame_len,
                   bytes_received=(stats.bytes_received
                                   or stats.packets_received * self.wire.frame_len),
                   retransmissions=stats.retransmissions, timeouts=stats.timeouts,
                   fast_retransmits=stats.fast_retransmits, duplicates=stats.duplicates,
                   refused=stats.refused, send_errors=stats.send_errors, clipped=a.clipped,
                   headroom=codec.headroom, bits=codec.fmt.bits, **gvq,
                   rel_error=err, encode_s=a.encode_s + compress_s, decode_s=decode_s,
                   rtt_median_s=statistics.median(rtts) if rtts else None,
                   window_mean=stats.window_mean, wakeups=stats.wakeups, **learned)

    def run(self):
        cfg = self.cfg
        if self.ring is not None:
            self.ring.connect(timeout=cfg.start_timeout)
        kernels.warm()  # compiled (or loaded) before the timed part
        comp = cfg.run.compression
        self._emit(type="start", mode=cfg.run.workload.mode, job_id=cfg.job_id,
                   worker=cfg.worker, bits=cfg.bits, lanes=self.fmt.lanes,
                   lane_width=self.fmt.width, elements=self.elements, window=self.window,
                   trace=self.source.name, compress=comp.compress,
                   payload_words=self.wire.words, packed=self.fmt.packed,
                   quantizer=comp.quantizer)
        if cfg.start_file:
            deadline = time.monotonic() + cfg.start_timeout
            while not Path(cfg.start_file).exists():
                if time.monotonic() > deadline:
                    raise AgentError(f"no start signal ({cfg.start_file}) within "
                                     f"{cfg.start_timeout:.0f} s")
                time.sleep(0.002)
            given = Path(cfg.start_file).read_text().strip()
            if given:  # a job admitted on arrival learns its slots with its start signal
                self.stream.slot_base = int(json.loads(given)["slot_base"])
        usage0 = resource.getrusage(resource.RUSAGE_SELF)
        predicted, size = None, None
        for i in range(cfg.run.workload.iterations):
            a = self.iteration(i, predicted)
            # The next vector has this one's shape and format unless GradiVeQ switches
            # between exact and compressed iterations.
            same = self.exact_iteration(i) == self.exact_iteration(i + 1)
            predicted = (self.codec_for(i).predict(a.next_scales, a.top, a.short)
                         if same and self.ring is None else None)
            size = len(a.total)
        if cfg.run.output.record_levels:
            np.savez(Path(cfg.output).with_suffix(".npz"), **self.levels_record)
        usage = resource.getrusage(resource.RUSAGE_SELF)
        # CPU time of the iterations (warm-ups included), not of loading the trace
        self._emit(type="done", end=time.time(), last_values=size,
                   cpu_user_s=usage.ru_utime - usage0.ru_utime,
                   cpu_system_s=usage.ru_stime - usage0.ru_stime)

    def _emit(self, **record):
        self.out.write(json.dumps(record) + "\n")

    def close(self):
        self.sock.close()
        if self.ring is not None:
            self.ring.close()
        self.out.close()


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    signal.signal(signal.SIGTERM, _interrupt)
    if len(argv) != 1:
        print("usage: python -m qaina_bench.hosts.agent CONFIG.json", file=sys.stderr)
        return 2
    try:
        cfg = AgentConfig.load(argv[0])
        agent = Agent(cfg)
    except (OSError, ValueError, TypeError, AgentError) as exc:
        print(f"agent: {exc}", file=sys.stderr)
        return 2
    profile = _profiler()
    try:
        agent.run()
    except (AgentError, RingError, PSError) as exc:
        agent._emit(type="error", message=str(exc), end=time.time())
        print(f"agent {cfg.job_id}/{cfg.worker}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        agent._emit(type="interrupted", end=time.time())
        return 130
    finally:
        agent.close()
        if profile is not None:
            profile.disable()
            profile.dump_stats(Path(cfg.output).with_suffix(".prof"))
    return 0


def _profiler():
    """cProfile of the agent's run when ``QAINA_AGENT_PROFILE=1`` is set (the stats go
    beside its record file, ``<output>.prof``): where an agent's CPU goes."""
    if os.environ.get("QAINA_AGENT_PROFILE") != "1":
        return None
    import cProfile
    profile = cProfile.Profile(time.process_time)
    profile.enable()
    return profile


def _exit(code: int):
    """Leave without the interpreter's teardown (which costs a numba-loaded process
    about 0.15 s of CPU, while other agents still run): the records are closed."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    _exit(main())
