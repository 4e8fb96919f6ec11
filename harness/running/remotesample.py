"""The link and CPU samples of one server of a cluster, taken there
(``python -m qaina_bench.harness.running.remotesample OUT INTERVAL [--interface NAME]...
[--process NAME=PID]...``, started by ``remote launch``): every INTERVAL seconds, and
once more on SIGTERM, the byte and packet counters of the named interfaces, the
machine's CPU seconds per state (``/proc/stat``) and each named process's user and
system seconds and seconds waiting for a CPU, as rows of ``timeseries.csv``
(``TIMESERIES_COLUMNS``; kinds ``link``, ``cpu``, ``proc``) in OUT, a CSV file under
the run's directory on that server. The harness's side is ``remotesampling.py``."""

from __future__ import annotations

import csv
import os
import signal
import sys
import threading
import time

import psutil

from ..results.resultset import TIMESERIES_COLUMNS
from .cpustat import STAT_FIELDS, SchedClock, machine_times, process_times


class ServerSamples:
    """The counters of this server's interfaces and processes, one row per sample."""

    def __init__(self, interfaces: list[str], processes: dict[str, int]):
        self.interfaces = interfaces
        self.procs, self.clocks = {}, {}
        for name, pid in processes.items():
            try:
                self.procs[name] = psutil.Process(pid)
                self.clocks[name] = SchedClock(pid)
            except psutil.Error:
                pass  # ended already: nothing to sample

    def rows(self) -> list[dict]:
        t = time.time()
        io = psutil.net_io_counters(pernic=True)
        out = [{"time": t, "kind": "link", "interface": name, "bytes_sent": c.bytes_sent,
                "bytes_recv": c.bytes_recv, "packets_sent": c.packets_sent,
                "packets_recv": c.packets_recv}
               for name, c in ((n, io.get(n)) for n in self.interfaces) if c is not None]
        machine = machine_times()
        out.append({"time": t, "kind": "cpu", **{f"{k}_s": machine[k] for k in STAT_FIELDS}})
        for name, p in self.procs.items():
            try:
                user, system = process_times(p)
            except psutil.Error:  # reaped: its last sample stands
                continue
            out.append({"time": t, "kind": "proc", "process": name, "user_s": user,
                        "system_s": system, "wait_s": self.clocks[name].wait_s()})
        return out


def parse(argv: list[str]) -> tuple[str, float, list[str], dict[str, int]]:
    out, interval, rest = argv[0], float(argv[1]), argv[2:]
    interfaces, processes = [], {}
    for flag, value in zip(rest[::2], rest[1::2]):
        if flag == "--interface":
            interfaces.append(value)
        elif flag == "--process":
            name, pid = value.rsplit("=", 1)
            processes[name] = int(pid)
    return out, interval, interfaces, processes


def main(argv: list[str]) -> int:
    if len(argv) < 2 or len(argv) % 2:
        print(__doc__, file=sys.stderr)
        return 2
    out, interval, interfaces, processes = parse(argv)
    halt = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: halt.set())
    samples = ServerSamples(interfaces, processes)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w", newline="", buffering=1) as f:
        writer = csv.DictWriter(f, TIMESERIES_COLUMNS, extrasaction="ignore")
        writer.writeheader()
        start, tick = time.monotonic(), 0
        while True:
            writer.writerows(samples.rows())
            if halt.is_set():
                return 0
            tick += 1  # a fixed schedule: a slow sample delays one tick, not the rest
            halt.wait(max(0.0, start + tick * interval - time.monotonic()))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
