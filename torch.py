"""PyTorch DistributedDataParallel through the testbed: a DDP communication hook.

``qaina-bench up --train-script SCRIPT`` starts SCRIPT once per worker host with the
process group's environment and ``QAINA_AGENT_CONFIG`` (harness/trainscript.py); in
the script::

    import torch.distributed as dist
    from qaina_bench.torch import TestbedState, testbed_hook

    dist.init_process_group("gloo")          # rendezvous at the job's worker 0
    state = TestbedState.from_env()          # this worker's agent configuration
    model = DistributedDataParallel(net)
    model.register_comm_hook(state, testbed_hook)
    ...                                      # train as usual
    state.close()

``testbed_hook`` takes each gradient bucket through the steps an agent takes
(hosts/pipeline.py: the job's bits, quantizer, lane packing and error feedback, a
pipeline per bucket) and sums it with the job's collective (hosts/collective.py: the
switch's slots, the ring or the parameter server of ``--mode``); the bucket's future
holds the dequantized sum divided by the world size, the average DDP expects.
``allreduce_hook`` is plain DDP all-reduce (the process group's, gloo) with the same
records, the baseline of the same script. Both hooks finish a bucket before they
return (a completed future): one bucket at a time, in DDP's bucket order, which is
the same on every worker.

The state writes what an agent writes (its JSON-lines file): a ``start`` record once
the collective is connected, then one ``iteration`` record per training step (every
bucket of the step: elements, bytes, packets, retransmissions, times), with what the
script gives ``note()`` (``train_loss``, ``test_accuracy``, ...), and ``done`` at
``close()``. It waits for the harness's start signal before the first bucket.

PyTorch stays optional: it is imported when a hook or the state needs it, with one
line saying how to install the CPU build where it is missing.
"""

from __future__ import annotations

import sys

if __name__ == "torch":  # pragma: no cover - the repository's root on sys.path
    # Imported as the top-level ``torch`` (Python started in the repository's root, which
    # holds this file): hand the importer PyTorch instead, found without that directory.
    import importlib
    import os
    _here = os.path.dirname(os.path.abspath(__file__))
    _path = list(sys.path)
    del sys.modules["torch"]
    sys.path[:] = [p for p in _path if os.path.abspath(p or ".") != _here]
    try:
        sys.modules["torch"] = importlib.import_module("torch")
    finally:
        sys.path[:] = _path

import json
import os
import resource
import statistics
import time
from pathlib import Path

import numpy as np

from qaina_bench.hosts import kernels
from qaina_bench.hosts.agent import AgentConfig, _profiler, wait_for_start
from qaina_bench.hosts.collective import MODES, CollectiveError
from qaina_bench.hosts.compression import CodecConfig
from qaina_bench.hosts.pipeline import Pipeline
from qaina_bench.hosts.ps import PSError
from qaina_bench.hosts.ring import RingError

#: the environment variable ``up --train-script`` sets (harness/trainscript.py's)
CONFIG_ENV = "QAINA_AGENT_CONFIG"
TORCH_HINT = ("qaina_bench.torch needs PyTorch; install its CPU build: pip install torch "
              "--index-url https://download.pytorch.org/whl/cpu")


class HookError(RuntimeError):
    """The hook cannot aggregate (a bad configuration, a collective that failed)."""


def require_torch():
    """PyTorch (with torch.distributed), or ImportError in one line saying how to get it."""
    try:
        import torch
        import torch.distributed  # noqa: F401
    except ImportError:
        raise ImportError(TORCH_HINT) from None
    return torch


def link_counters() -> tuple[int, int, int, int]:
    """Bytes and packets sent and received on this network namespace's interfaces
    (``/proc/net/dev``, loopback left out): tx bytes, tx packets, rx bytes, rx packets."""
    tx = txp = rx = rxp = 0
    with open("/proc/net/dev") as f:
        for line in f.readlines()[2:]:
            name, data = line.split(":", 1)
            if name.strip() == "lo":
                continue
            v = data.split()
            rx, rxp, tx, txp = rx + int(v[0]), rxp + int(v[1]), tx + int(v[8]), txp + int(v[9])
    return tx, txp, rx, rxp


#: fields of a bucket's part that a step's record sums
SUMMED = ("elements", "values", "chunks", "packets_sent", "packets_received", "bytes_sent",
          "bytes_received", "retransmissions", "timeouts", "fast_retransmits", "duplicates",
          "refused", "send_errors", "clipped", "encode_s", "decode_s", "cpu_s", "wakeups")


class TestbedState:
    """The hooks' state: one worker of a job, as the harness configured it (its
    ``AgentConfig``). ``through_testbed`` False: no collective (``allreduce_hook``)."""

    def __init__(self, config: AgentConfig, through_testbed: bool = True):
        self.cfg = config
        work, comp = config.run.workload, config.run.compression
        self.rank, self.world = config.worker, work.workers
        self.through_testbed = through_testbed
        self.float = comp.quantizer == "none"
        try:
            mode = MODES.get(work.mode)
            if self.float and (not mode.float_sums or config.bits != 32):
                raise ValueError(f"quantizer none needs --bits 32 and a mode that sums "
                                 f"floats, not --mode {work.mode}")
            self.codec = CodecConfig(config.bits, work.workers,
                                     "maxpow2" if self.float else comp.quantizer, comp.bucket,
                                     comp.error_feedback, comp.headroom, comp.pack)
            self.collective = mode.collective(config, self._emit) if through_testbed else None
        except (ValueError, CollectiveError) as exc:
            raise HookError(str(exc)) from None
        self.pipelines: dict[tuple[int, int], list] = {}  # (bucket, size) -> [pipeline, i]
        self.out = open(config.output, "w", buffering=1)
        self.step = 0
        self.parts: list[dict] = []  # the buckets of the step so far
        self.notes: dict = {}
        self.levels: dict[str, list] = {}  # --record-levels: this step's, bucket by bucket
        self.levels_record: dict[str, np.ndarray] = {}
        self.usage0 = None
        self.profile = None
        #: over the steps so far: bytes this worker sent, seconds spent aggregating
        self.totals = {"steps": 0, "bytes_sent": 0, "comm_s": 0.0}

    @staticmethod
    def config_path() -> str:
        path = os.environ.get(CONFIG_ENV)
        if not path:
            raise HookError(f"${CONFIG_ENV} is not set: start the script with "
                            "`qaina-bench up --train-script SCRIPT`")
        return path

    @classmethod
    def settings(cls):
        """The run's configuration tree (``settings.Settings``), to read before the
        state is made (steps, learning rate, seed)."""
        return AgentConfig.load(cls.config_path()).run

    @classmethod
    def from_env(cls, through_testbed: bool = True) -> "TestbedState":
        """The state of the worker ``up --train-script`` started: its configuration from
        ``$QAINA_AGENT_CONFIG``; connected, and its ``start`` record written (make it
        once the script is ready to train: the harness starts the job when every
        worker's state is there)."""
        state = cls(AgentConfig.load(cls.config_path()), through_testbed)
        state.profile = _profiler()  # QAINA_AGENT_PROFILE=1: cProfile, as for an agent
        state.connect()
        return state

    # -- the worker's life -------------------------------------------------------------
    def connect(self):
        """Reach the job's peers (ring, parameter server), then write ``start``."""
        cfg = self.cfg
        if self.collective is not None:
            try:
                self.collective.connect(cfg.start_timeout)
            except (CollectiveError, RingError, PSError, OSError) as exc:
                raise HookError(f"worker {cfg.worker}: {exc}") from None
            kernels.warm()
        self._emit(type="start", mode=cfg.run.workload.mode, job_id=cfg.job_id,
                   worker=cfg.worker, bits=cfg.bits, window=cfg.slots, trace=None,
                   hook="testbed" if self.through_testbed else "allreduce",
                   compress="none", payload_words=cfg.run.network.payload_words,
                   quantizer=cfg.run.compression.quantizer)

    def _wait_start(self):
        """Before the first bucket: the harness's start signal (all workers are ready)."""
        if self.usage0 is not None:
            return
        cfg = self.cfg
        if cfg.start_file:
            try:
                given = wait_for_start(cfg.start_file, cfg.start_timeout)
            except TimeoutError as exc:
                raise HookError(str(exc)) from None
            if self.collective is not None:
                self.collective.start(given)
        self.usage0 = resource.getrusage(resource.RUSAGE_SELF)

    def note(self, **fields):
        """Fields for the record of the step under way (e.g. ``train_loss``, or
        ``test_accuracy`` of the model the step starts from)."""
        self.notes.update(fields)

    def close(self, **fields):
        """The ``done`` record (with ``fields``, e.g. the final accuracy), the levels kept
        with --record-levels, and the collective closed."""
        if self.out.closed:
            return
        try:
            if self.cfg.run.output.record_levels and self.levels_record:
                np.savez(Path(self.cfg.output).with_suffix(".npz"), **self.levels_record)
            usage = resource.getrusage(resource.RUSAGE_SELF)
            u0 = self.usage0 or usage
            self._emit(type="done", end=time.time(), steps=self.step,
                       cpu_user_s=usage.ru_utime - u0.ru_utime,
                       cpu_system_s=usage.ru_stime - u0.ru_stime, **fields)
        finally:
            if self.collective is not None:
                self.collective.close()
            self.out.close()
            if self.profile is not None:
                self.profile.disable()
                self.profile.dump_stats(Path(self.cfg.output).with_suffix(".prof"))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- one bucket --------------------------------------------------------------------
    def _pipeline(self, index: int, size: int) -> list:
        """[pipeline, its next iteration] of a bucket: its own error feedback and
        predicted scales (DDP rebuilds its buckets after the first step: new ones)."""
        key = (index, size)
        if key not in self.pipelines:
            seed = self.cfg.run.workload.seed
            self.pipelines[key] = [Pipeline(self.codec, [seed, self.cfg.job_id, self.cfg.worker,
                                                         index, size],
                                            self.cfg.run.network.payload_words, None,
                                            self.float), 0]
        return self.pipelines[key]

    def reduce(self, index: int, grad: np.ndarray, last: bool) -> np.ndarray:
        """The sum over the job's workers of bucket ``index`` (float32), through the
        testbed; ``last``: the step's last bucket (its record is written)."""
        self._wait_start()
        cpu0 = time.process_time()
        entry = self._pipeline(index, grad.size)
        pipe, i = entry
        enc = pipe.encode(i, grad)
        try:
            a = self.collective.all_reduce(enc.values, enc.codec, pipe.predicted)
        except (CollectiveError, RingError, PSError) as exc:
            raise HookError(f"worker {self.cfg.worker}: {exc}") from None
        t1 = time.perf_counter()
        total = pipe.decode(enc, a)
        decode_s = time.perf_counter() - t1
        pipe.adapt(enc, a, total)
        entry[1] = i + 1
        s = a.stats
        self.parts.append(dict(
            start=s.first_send, end=time.time(), elements=grad.size, values=len(enc.values),
            chunks=len(a.scale), packets_sent=s.packets_sent,
            packets_received=s.packets_received,
            bytes_sent=s.bytes_sent or s.packets_sent * self._frame(),
            bytes_received=s.bytes_received or s.packets_received * self._frame(),
            retransmissions=s.retransmissions, timeouts=s.timeouts,
            fast_retransmits=s.fast_retransmits, duplicates=s.duplicates, refused=s.refused,
            send_errors=s.send_errors, clipped=a.clipped, encode_s=a.encode_s + enc.compress_s,
            decode_s=decode_s, cpu_s=time.process_time() - cpu0, wakeups=s.wakeups,
            headroom=enc.codec.headroom, bits=enc.codec.fmt.bits, rtts=list(s.rtts),
            window_mean=s.window_mean))
        if self.cfg.run.output.record_levels:
            for name, value in (("levels", a.levels), ("sums", a.sums.astype(np.int64)),
                                ("aggregate", a.total), ("scale", a.scale)):
                self.levels.setdefault(name, []).append(value)
        if last:
            self._end_step()
        return total

    def _frame(self) -> int:
        from qaina_bench.p4.header import wire
        return wire(self.cfg.run.network.payload_words).frame_len

    def measure_allreduce(self, run, elements: int, last: bool):
        """Time ``run()`` (the process group's all-reduce of a bucket of ``elements``)
        and count what this host's links carried meanwhile; ``last`` as in ``reduce``."""
        self._wait_start()
        cpu0, start = time.process_time(), time.time()
        tx0, txp0, rx0, rxp0 = link_counters()
        run()
        tx, txp, rx, rxp = link_counters()
        self.parts.append(dict(start=start, end=time.time(), elements=elements,
                               values=elements, chunks=0, packets_sent=txp - txp0,
                               packets_received=rxp - rxp0, bytes_sent=tx - tx0,
                               bytes_received=rx - rx0, cpu_s=time.process_time() - cpu0,
                               bits=32))
        if last:
            self._end_step()

    def _end_step(self):
        """The step's ``iteration`` record: its buckets' parts summed."""
        parts, self.parts = self.parts, []
        record = {k: sum(p.get(k) or 0 for p in parts) for k in SUMMED}
        rtts = [r for p in parts for r in p.get("rtts", [])]
        start, end = min(p["start"] for p in parts), max(p["end"] for p in parts)
        windows = [p["window_mean"] for p in parts if p.get("window_mean") is not None]
        record.update(type="iteration", iteration=self.step, start=start, end=end,
                      completion_s=end - start, compressed=False, buckets=len(parts),
                      headroom=parts[-1].get("headroom"), bits=parts[-1].get("bits"),
                      rel_error=None, rtt_median_s=statistics.median(rtts) if rtts else None,
                      window_mean=statistics.mean(windows) if windows else None,
                      **self.notes)
        self._emit(**record)
        self.totals["steps"] += 1
        self.totals["bytes_sent"] += record["bytes_sent"]
        self.totals["comm_s"] += sum(p["end"] - p["start"] for p in parts)
        if self.levels:
            for name, values in self.levels.items():
                self.levels_record[f"{name}_{self.step}"] = np.concatenate(values)
            self.levels_record[f"bits_{self.step}"] = np.array(record["bits"])
            self.levels = {}
        self.notes = {}
        self.step += 1

    def _emit(self, **record):
        self.out.write(json.dumps(record) + "\n")


def testbed_hook(state: TestbedState, bucket):
    """DDP communication hook: the bucket summed through the testbed, averaged."""
    torch = require_torch()
    tensor = bucket.buffer()
    grad = tensor.detach().to("cpu", torch.float32).numpy().ravel()
    total = state.reduce(bucket.index(), np.ascontiguousarray(grad), bucket.is_last())
    out = torch.from_numpy(np.asarray(total, dtype=np.float32) / state.world)
    future = torch.futures.Future()
    future.set_result(out.to(tensor.device, tensor.dtype).reshape(tensor.shape))
    return future


def allreduce_hook(state: TestbedState, bucket):
    """DDP communication hook: plain all-reduce of the process group (what DDP does
    without a hook), averaged, with the testbed's records (bytes from the links)."""
    torch = require_torch()
    dist = torch.distributed
    tensor = bucket.buffer()
    state.measure_allreduce(lambda: dist.all_reduce(tensor), tensor.numel(), bucket.is_last())
    tensor.div_(state.world)
    future = torch.futures.Future()
    future.set_result(tensor)
    return future
