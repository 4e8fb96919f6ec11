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

GradiVeQ (``compress="gradiveq"``, hosts/gradiveq.py): the first ``gvq_fit_iterations``
iterations, and with ``gvq_refresh`` = R every (R + 1)-th after them, are aggregated
uncompressed at 32 bits (exact data); every worker fits the same per-layer bases to
the identical aggregates it received (no extra communication), and the other
iterations aggregate the coefficients of every ``d``-element slice of the large
layers and the small layers as they are, quantized to the job's bits: the
compression is linear, so the switch's sum of coefficients is the coefficients of
the sum, which the agent decompresses.

The steps of an iteration are ``hosts/pipeline.py``'s, shared with the offline
evaluation; the sum over the job's workers is the mode's collective
(``hosts/collective.py``): ``ina`` through the switch as above, ``ring`` and ``ps`` the
host-based baselines (the same quantization and lanes, summed by ring all-reduce between
the workers or by a parameter server, over the same fabric), or a registered plugin.

Run: ``python -m qaina_bench.hosts.agent CONFIG.json`` (the harness writes the config).
"""

from __future__ import annotations

import json
import os
import resource
import signal
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ..p4.header import QAINA_UDP_PORT, wire
from . import kernels
from .collective import MODES, CollectiveError
from .compression import CodecConfig, WorkerCodec
from .pipeline import Aggregated, Pipeline, compressor
from .ps import PS_PORT, PSError
from .ring import RingError
from .sources import LiveTraining, TraceReplay
from ..settings import ConfigError, Settings
from .traces import TraceError
DEFAULT_HEADROOM = 1  # predicted scales x2 for b <= 8
DEFAULT_HEADROOM_32 = 8  # x256 for the 32-bit fixed point


def wait_for_start(start_file: str, timeout: float) -> dict:
    """Wait for the harness's start signal (every worker is ready) and return what it
    gives: a job admitted on arrival learns its slots from it. TimeoutError (one line)
    when it has not come within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not Path(start_file).exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no start signal ({start_file}) within {timeout:.0f} s")
        time.sleep(0.002)
    given = Path(start_file).read_text().strip()
    return json.loads(given) if given else {}


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
    exact_sums: str = ""  # the job's exact sums (TraceSet.write_exact_sums); "": sum here
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


class Agent:
    """One worker: its gradients (a trace replayed, or training) through the iteration
    pipeline (hosts/pipeline.py), aggregated by its mode's collective (hosts/collective.py)."""

    def __init__(self, cfg: AgentConfig):
        self.cfg = cfg
        work, comp = cfg.run.workload, cfg.run.compression
        words = cfg.run.network.payload_words
        try:
            self.mode = MODES.get(work.mode)
            self.wire = wire(words)
            self.float = comp.quantizer == "none"
            if self.float and (not self.mode.float_sums or cfg.bits != 32):
                raise ValueError(f"quantizer none (float32 sums) is for --bits 32 with a mode "
                                 f"that sums floats ({', '.join(self.float_modes())}), "
                                 f"not --mode {work.mode}")
            self.source = self._source()
            codec = CodecConfig(cfg.bits, work.workers,
                                "maxpow2" if self.float else comp.quantizer, comp.bucket,
                                comp.error_feedback, comp.headroom, comp.pack)
            try:
                squeezer = compressor(comp.compress, self.source.layers, comp.gvq_d,
                                      comp.gvq_k, comp.gvq_fit, comp.gvq_refresh)
            except ValueError as exc:
                raise ValueError(f"--compress {comp.compress}: {exc}") from None
            self.pipeline = Pipeline(codec, [work.seed, cfg.job_id, cfg.worker], words,
                                     squeezer, self.float)
            self.collective = self.mode.collective(cfg, self._emit)
        except (ValueError, TraceError, CollectiveError) as exc:
            raise AgentError(str(exc)) from None
        self.fmt = self.pipeline.codec.fmt
        self.elements = self.source.elements
        self.out = open(cfg.output, "w", buffering=1)
        self.levels_record: dict[str, np.ndarray] = {}

    @staticmethod
    def float_modes() -> list[str]:
        return [name for name in MODES.names() if MODES.get(name).float_sums]

    def _source(self):
        cfg, work, tr = self.cfg, self.cfg.run.workload, self.cfg.run.training
        if tr.train:
            return LiveTraining(cfg.worker, work.workers, work.iterations, tr.model, work.seed,
                                tr.lr, tr.batch_size, tuple(tr.hidden), tr.width,
                                tr.eval_every)
        return TraceReplay(cfg.trace, cfg.worker if cfg.trace_worker is None
                           else cfg.trace_worker, work.workers, work.iterations,
                           cfg.exact_sums)

    # -- iterations --------------------------------------------------------------------
    def iteration(self, i: int) -> Aggregated:
        """Aggregate iteration ``i`` through the pipeline: compressed with GradiVeQ but
        for its exact iterations, which fit or refresh the bases; the scales of the
        first chunks predicted from the last iteration where the mode returns maxima."""
        cpu0 = time.process_time()
        grad = self.source.gradient(i)
        enc = self.pipeline.encode(i, grad)
        try:
            a = self.collective.all_reduce(enc.values, enc.codec, self.pipeline.predicted)
        except CollectiveError as exc:
            raise AgentError(str(exc)) from None
        t1 = time.perf_counter()
        aggregate = self.pipeline.decode(enc, a)
        end = time.time()
        decode_s = time.perf_counter() - t1
        self.pipeline.adapt(enc, a, aggregate)
        exact = self.source.exact(i)
        err = None if exact is None else float(kernels.relative_error(aggregate, exact))
        learned = self.source.apply(i, aggregate)
        if self.cfg.run.output.record_levels:
            self.levels_record[f"levels_{i}"] = a.levels
            self.levels_record[f"sums_{i}"] = a.sums.astype(np.int64)
            self.levels_record[f"aggregate_{i}"] = a.total
            self.levels_record[f"scale_{i}"] = a.scale
            self.levels_record[f"bits_{i}"] = np.array(enc.codec.fmt.bits)
        learned["cpu_s"] = time.process_time() - cpu0
        self._record_iteration(i, a, enc.values, enc.compressed, end, err, enc.compress_s,
                               decode_s, enc.codec, learned)
        return a

    def _record_iteration(self, i: int, a: Aggregated, values, compressed: bool, end: float,
                          err: float | None, compress_s: float, decode_s: float,
                          codec: WorkerCodec, learned: dict):
        stats, rtts = a.stats, a.stats.rtts
        squeezer = self.pipeline.gvq  # the compressor's own figures, once it has them
        gvq = squeezer.metrics(self.source.exact(i)) if squeezer is not None else {}
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
                   window_mean=stats.window_mean, wakeups=stats.wakeups,
                   lingered_s=stats.lingered_s, **learned)

    def run(self):
        cfg = self.cfg
        self.collective.connect(cfg.start_timeout)
        kernels.warm()  # compiled (or loaded) before the timed part
        self._emit(type="start", mode=cfg.run.workload.mode, job_id=cfg.job_id,
                   worker=cfg.worker, bits=cfg.bits,
                   lanes=self.fmt.lanes, lane_width=self.fmt.width, elements=self.elements,
                   window=cfg.slots, trace=self.source.name, compress=cfg.run.compression.compress,
                   payload_words=self.wire.words, packed=self.fmt.packed,
                   quantizer=cfg.run.compression.quantizer,
                   tcp_congestion=self.collective.tcp_congestion)
        if cfg.start_file:
            try:
                self.collective.start(wait_for_start(cfg.start_file, cfg.start_timeout))
            except TimeoutError as exc:
                raise AgentError(str(exc)) from None
        usage0 = resource.getrusage(resource.RUSAGE_SELF)
        size = None
        for i in range(cfg.run.workload.iterations):
            size = len(self.iteration(i).total)
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
        self.collective.close()
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
    except (AgentError, CollectiveError, RingError, PSError) as exc:
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
