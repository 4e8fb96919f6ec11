"""What the harness measures while a run goes, on a thread of its own.

* **Slot usage**: the aggregating switch's per-job counters (``slots_opened``,
  ``slots_closed``, ``agg_packets``, ``retx_answered``, ``results_sent``), read every
  ``slot_interval`` (10 ms) over P4Runtime, only the jobs' cells in one Read; slots
  in use = opened - closed. Counters, because BMv2 serves no register reads.
* **Everything else** every ``slow_interval`` (100 ms) and once at the end: every
  switch's drops by reason, every switch interface's byte and packet counters.
* **CPU**: busy share of every core and of each switch and agent process, every
  ``slow_interval``. ``SATURATED`` says when a run's timings measure the machine
  rather than the network (the rule of result sets made before the fidelity verdict).
  The same ticks write cumulative counters to ``timeseries.csv`` from which
  ``harness/results/fidelity.py`` takes any interval: ``kind=proc`` per process, user and
  system seconds and seconds waiting for a CPU (``cpustat``); ``kind=cpu`` the
  machine's seconds per state (``/proc/stat``).

Ticks follow a fixed schedule (the n-th at start + n x interval), so a slow read delays
one sample, not all later ones; ``summary()`` says what intervals were achieved.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import psutil

from .cpustat import STAT_FIELDS, SchedClock, machine_times, process_times
from ..results.fidelity import BUSY_STATES
from ..results.resultset import ResultWriter

COUNTERS = ("MyIngress.slots_opened", "MyIngress.slots_closed", "MyIngress.agg_packets",
            "MyIngress.retx_answered", "MyEgress.results_sent", "MyIngress.fallback_packets")
SATURATED = 0.9  # busy share of a core (or of all cores) that counts as saturated


def busy_percent(cores) -> list[float]:
    """Per core of ``psutil.cpu_times_percent(percpu=True)``, the percent busy as the
    fidelity verdict counts it: niced work (it yields to the run), idle and iowait left
    out."""
    return [sum(getattr(c, state, 0.0) for state in BUSY_STATES) for c in cores]


class Sampler(threading.Thread):
    """Samples a running testbed into a ``ResultWriter`` until ``stop()``."""

    def __init__(self, writer: ResultWriter, conns: dict, aggregator: str | None, jobs,
                 interfaces: list[str], processes: dict[str, int],
                 slot_interval: float = 0.01, slow_interval: float = 0.1, remote=()):
        super().__init__(name="sampler", daemon=True)
        self.writer = writer
        self.conns = conns  # switch name -> SwitchConnection
        self.aggregator = aggregator  # None: no in-network jobs (ring mode)
        self.jobs = jobs
        self.interfaces = interfaces
        #: the samplers on the other servers of a cluster (``remotesampling.py``)
        self.remote = list(remote)
        self.slot_interval = slot_interval
        self.slow_interval = slow_interval
        self.error: str | None = None
        self._halt = threading.Event()
        self._slot_times: list[float] = []
        self._procs = {}
        self._clocks = {}
        for name, pid in processes.items():
            try:
                p = psutil.Process(pid)
                p.cpu_percent(None)  # the first call starts the measurement
                self._procs[name] = p
                self._clocks[name] = SchedClock(pid)
            except psutil.Error:
                pass
        psutil.cpu_times_percent(percpu=True)
        self._cores: list[list[float]] = []
        self._proc_busy: dict[str, list[float]] = {name: [] for name in self._procs}

    # -- the thread ------------------------------------------------------------------
    def begin(self):
        """Take the first samples now, in the caller's thread, then sample on (the
        other servers' samplers started first)."""
        for sampler in self.remote:
            sampler.start()
        if self.aggregator is not None:
            self._sample_slots()
        self._sample_slow()
        self.start()

    def run(self):
        start = time.monotonic()
        tick, slow_every = 0, max(1, round(self.slow_interval / self.slot_interval))
        try:
            while not self._halt.is_set():
                if self.aggregator is not None:
                    self._sample_slots()
                if tick % slow_every == 0:
                    self._sample_slow()
                tick += 1
                delay = start + tick * self.slot_interval - time.monotonic()
                if delay < 0:  # late: skip the ticks that passed, keep the schedule
                    tick += int(-delay / self.slot_interval) + 1
                    delay = start + tick * self.slot_interval - time.monotonic()
                self._halt.wait(max(0.0, delay))
            if self.aggregator is not None:
                self._sample_slots()
            self._sample_slow()
        except Exception as exc:  # a switch that stopped answering ends the run
            self.error = str(exc)

    def stop(self):
        self._halt.set()
        if self.is_alive():
            self.join(10)
        for sampler in self.remote:
            sampler.stop()

    # -- samples ---------------------------------------------------------------------
    def _sample_slots(self):
        conn = self.conns[self.aggregator]
        cells = conn.read_counter_cells(COUNTERS, [job.index for job in self.jobs])
        t = time.time()
        self._slot_times.append(t)
        for job in self.jobs:
            row = {"time": t, "switch": self.aggregator, "job": job.job_id}
            for name in COUNTERS:
                row[name.split(".")[-1]] = cells[name].get(job.index, (0, 0))[0]
            row["slots_in_use"] = row["slots_opened"] - row["slots_closed"]
            self.writer.add_sample(row)

    def _sample_slow(self):
        t = time.time()
        for sw, conn in self.conns.items():
            try:
                drops = conn.read_counter("MyIngress.drops")
            except Exception as exc:
                raise RuntimeError(f"switch {sw} stopped answering P4Runtime: {exc}") from None
            self.writer.add_drops(t, sw, {i: v[0] for i, v in drops.items()})
        io = psutil.net_io_counters(pernic=True)
        for ifname in self.interfaces:
            c = io.get(ifname)
            if c is not None:
                self.writer.add_link_sample({"time": t, "interface": ifname,
                                             "bytes_sent": c.bytes_sent,
                                             "bytes_recv": c.bytes_recv,
                                             "packets_sent": c.packets_sent,
                                             "packets_recv": c.packets_recv})
        self._cores.append(busy_percent(psutil.cpu_times_percent(percpu=True)))
        for name, p in self._procs.items():
            try:
                self._proc_busy[name].append(p.cpu_percent(None) / 100)
            except psutil.Error:
                pass
        self._sample_cpu_time()

    def _sample_cpu_time(self):
        t = time.time()
        machine = machine_times()
        self.writer.add_cpu_sample({"time": t, **{f"{k}_s": machine[k] for k in STAT_FIELDS}})
        for name, p in self._procs.items():
            try:
                user, system = process_times(p)
            except psutil.Error:  # reaped: its last sample stands
                continue
            self.writer.add_process_sample({"time": t, "process": name, "user_s": user,
                                            "system_s": system,
                                            "wait_s": self._clocks[name].wait_s()})

    # -- what it says ----------------------------------------------------------------
    def summary(self) -> dict:
        """How slot usage was sampled, and how busy the CPUs were."""
        gaps = np.diff(self._slot_times) if len(self._slot_times) > 1 else np.zeros(0)
        slots = ({"source": "not applicable: no in-network aggregation"}
                 if self.aggregator is None else {
                     "source": f"P4Runtime counter reads of {self.aggregator} "
                               "(slots_opened - slots_closed per job)",
                     "interval_target_s": self.slot_interval,
                     "interval_median_s": float(np.median(gaps)) if len(gaps) else None,
                     "interval_p99_s": float(np.percentile(gaps, 99)) if len(gaps) else None,
                     "interval_max_s": float(gaps.max()) if len(gaps) else None,
                     "samples": len(self._slot_times)})
        return {"slot_sampling": slots, "cpu": self.cpu()}

    def cpu(self) -> dict:
        # The first sample covers the time before the agents started: left out.
        cores = np.array(self._cores[1:] or self._cores or [[0.0]]) / 100
        busy = {name: float(np.mean(v[1:] or v)) if v else None
                for name, v in self._proc_busy.items()}
        saturated = []
        if cores.mean() > SATURATED:
            saturated.append(f"all cores {100 * cores.mean():.0f}% busy on average")
        for name, values in self._proc_busy.items():
            values = values[1:] or values
            if values and np.mean(np.array(values) > SATURATED) > 0.5:
                saturated.append(f"{name} used a whole core")
        return {"cores": int(cores.shape[1]), "cores_busy_mean": float(cores.mean()),
                "cores_busy_max": float(cores.max()), "process_busy_mean": busy,
                "saturated": "; ".join(saturated) or None}
