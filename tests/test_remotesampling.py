"""The sampler on another server of a cluster (``remotesample.py``, started and stopped
by ``remotesampling.RemoteSampler`` through ``remote launch``; here the server is this
machine): real counters of an interface and a process, a last sample on SIGTERM, its
rows merged into ``timeseries.csv`` under the server's name, its clock offset, and
the fidelity verdict taking the busiest server's cores."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil

from qaina_bench.harness.results.fidelity import cpu_load
from qaina_bench.harness.results.resultset import ResultWriter, read_csv
from qaina_bench.harness.running.cluster import Server
from qaina_bench.harness.running.remotesampling import (RemoteSampler, clock_offset,
                                                        local_kernel, machine_cpu,
                                                        merge_samples, process_cpu,
                                                        shared_kernels)


def test_a_remote_sampler_samples_its_interfaces_and_processes_until_stopped(tmp_path):
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        sampler = RemoteSampler(Server("localhost"), tmp_path, ["lo"],
                                {"agent j1w0": busy.pid}, interval=0.05)
        sampler.start()
        assert abs(sampler.clock["offset_s"]) < sampler.clock["round_trip_s"] + 0.01
        deadline = time.monotonic() + 60  # a busy machine starts the sampler late
        while time.monotonic() < deadline and (not sampler.out.exists() or sum(
                ",cpu," in line for line in sampler.out.read_text().splitlines()) < 6):
            time.sleep(0.05)
        time.sleep(0.3)
        sampler.stop()
        assert sampler.popen.returncode == 0  # it ended by itself, after its last sample
    finally:
        busy.kill()
        busy.wait()
    writer = ResultWriter(tmp_path / "run")
    os.rename(tmp_path / "samples", writer.dir / "samples")
    # the run's CPU window here: the ssh session's figures give way to the process's own
    readings = {"began": 0.0, "ended": time.time() + 60, "cores": 2,
                "processes": {"agent j1w0": {"component": "agents", "user_s": 0.001,
                                             "system_s": 0.0}}}
    clocks = merge_samples(writer, [sampler], readings)
    assert sampler.cores == psutil.cpu_count()  # the server's own count, once at start
    assert readings["cores_by_server"] == {"localhost": 2, sampler.server.name: sampler.cores}
    # the server is this machine: its kernel is this one's, not counted twice
    assert sampler.kernel == local_kernel() and sampler.kernel
    assert readings["shared_kernel"] == {} and readings["machine_by_server"] == {}
    writer.close()
    rows = read_csv(writer.dir / "timeseries.csv")
    assert rows and all(r["server"] == "localhost" for r in rows)
    assert clocks["localhost"]["samples"] == len(rows)
    kinds = {k: [r for r in rows if r["kind"] == k] for k in ("link", "cpu", "proc")}
    assert len(kinds["cpu"]) >= 5 and {r["interface"] for r in kinds["link"]} == {"lo"}
    proc = kinds["proc"]
    assert {r["process"] for r in proc} == {"agent j1w0"}
    used = float(proc[-1]["user_s"]) + float(proc[-1]["system_s"])
    spent = float(proc[-1]["time"]) - float(proc[0]["time"])
    assert used - float(proc[0]["user_s"]) - float(proc[0]["system_s"]) > 0.3 * spent
    folded = readings["processes"]["agent j1w0"]
    assert folded["server"] == "localhost" and folded["user_s"] + folded["system_s"] > 0.3 * spent


def test_process_cpu_spans_the_samples_around_the_window():
    rows = [{"kind": "proc", "process": "switch lf2", "time": t, "user_s": u, "system_s": s}
            for t, u, s in ((0.0, 1.0, 0.1), (1.0, 1.5, 0.2), (2.0, 2.5, 0.4), (3.0, 3.0, 0.5))]
    rows.append({"kind": "cpu", "time": 1.0, "user_s": 99})
    assert process_cpu(rows, 1.2, 1.8) == {"switch lf2": (1.0, 0.2)}  # samples at 1 and 2
    assert process_cpu(rows, -5, 9) == {"switch lf2": (2.0, 0.4)}  # first to last


def test_machine_cpu_spans_the_samples_around_the_window():
    rows = [{"kind": "cpu", "time": t, "softirq_s": q, "user_s": u}
            for t, q, u in ((0.0, 1.0, 5.0), (1.0, 1.5, 6.0), (2.0, 2.5, 8.0))]
    rows.append({"kind": "proc", "time": 1.5, "process": "agent j1w0", "user_s": 9})
    got = machine_cpu(rows, 1.2, 1.8)  # samples at 1 and 2
    assert got["softirq"] == 1.0 and got["user"] == 2.0 and got["idle"] == 0.0
    assert machine_cpu(rows[:1], 0, 1) == {}
    assert machine_cpu(rows + [dict(rows[1])], 1.2, 1.8)["softirq"] == 1.0  # a repeated time


def test_servers_on_one_kernel_are_counted_once():
    class Fake:
        def __init__(self, name, kernel):
            self.server, self.kernel = Server(name), kernel
    here = local_kernel()
    samplers = [Fake("qb-b", here), Fake("qb-c", "k2"), Fake("qb-d", "k2"), Fake("qb-e", None),
                Fake("localhost", here)]
    assert shared_kernels(samplers) == {"qb-b": "localhost", "qb-d": "qb-c"}


def test_the_clock_offset_of_this_machine_is_within_the_round_trip():
    clock = clock_offset(Server("localhost"))
    assert abs(clock["offset_s"]) <= clock["round_trip_s"]


def cpu_rows(server: str, busy_share: float) -> list[dict]:
    return [{"time": t, "server": server, "user_s": 10 * t * busy_share,
             "idle_s": 10 * t * (1 - busy_share), "system_s": 0, "nice_s": 0,
             "iowait_s": 0, "irq_s": 0, "softirq_s": 0, "steal_s": 0}
            for t in (0.0, 1.0, 2.0)]


def test_the_cpu_verdict_takes_the_busiest_server():
    rows = cpu_rows("", 0.2) + cpu_rows("qb-c", 0.95)
    cpu = cpu_load(rows, [], [], [(0.0, 2.0)])
    assert abs(cpu["cores_busy"] - 0.95) < 1e-9
    assert cpu["cores_busy_by_server"] == {"": 0.2, "qb-c": 0.95}
    alone = cpu_load(cpu_rows("", 0.2), [], [], [(0.0, 2.0)])
    assert abs(alone["cores_busy"] - 0.2) < 1e-9 and "cores_busy_by_server" not in alone
