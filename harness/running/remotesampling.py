"""The sampler's part on the other servers of a cluster, and their clocks.

``Sampler`` (``sampling.py``) reads this machine's ``/proc``: its links and CPUs, and
the processes it started here. On every other server, ``RemoteSampler`` starts
``remotesample.py`` there through ``remote launch`` (recorded by its PID, stopped
with the local sampler, removed by ``clean`` after a ``kill -9``): the interfaces of
the switches there and the run's processes there (switches, agents, servers, by
their PIDs there), written under the run's directory there as ``samples/<server>.csv``
and copied back with the rest of it (``rundir.py``). ``merge_samples`` adds those rows
to ``timeseries.csv`` with the server in its ``server`` column, where the fidelity
verdict reads them. Timestamps are each server's own clock: the servers must be
NTP-synchronised; each server's offset from this machine, measured when its sampler
starts (``clock_offset``: its ``date +%s.%N`` over ssh, as at the midpoint of the
round trip), is in the summary's ``clock_offsets``, with the server's cores
(``server_cores``), which ``merge_samples`` adds to the CPU cost's capacity.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from ..results.resultset import read_csv
from .cluster import Server
from .cpustat import STAT_FIELDS


def clock_offset(server: Server, exchanges: int = 5) -> dict:
    """``server``'s clock minus this machine's (s), and the ssh round trip it took:
    over one ssh session (its set-up is not in the round trip), the exchange with the
    shortest round trip, the server's ``date`` taken as at its midpoint."""
    try:
        shell = subprocess.Popen(server.ssh("sh", "-c", "while read x; do date +%s.%N; done"),
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=subprocess.DEVNULL, start_new_session=True)
    except OSError:
        return {"offset_s": None, "round_trip_s": None}
    best = (float("inf"), None)
    try:
        for k in range(exchanges + 1):  # the first one waits for the session: left out
            t0 = time.time()
            shell.stdin.write(b"\n")
            shell.stdin.flush()
            there = float(shell.stdout.readline())
            t1 = time.time()
            if k and t1 - t0 < best[0]:
                best = (t1 - t0, there - (t0 + t1) / 2)
    except (OSError, ValueError):
        pass  # no answer: what was measured stands
    finally:
        shell.kill()
        shell.wait()
    return {"offset_s": best[1], "round_trip_s": best[0] if best[1] is not None else None}


BOOT_ID = "/proc/sys/kernel/random/boot_id"  # one per running kernel


def server_cores(server: Server) -> tuple[int | None, str | None]:
    """The CPUs ``server`` has online (``getconf _NPROCESSORS_ONLN`` there, as
    ``psutil.cpu_count()`` counts them here) and the boot id of its kernel (servers
    that are containers of one machine share it); None for what it does not say."""
    try:
        res = subprocess.run(server.ssh("sh", "-c", f"getconf _NPROCESSORS_ONLN; cat {BOOT_ID}"),
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None, None
    said = res.stdout.split() if res.returncode == 0 else []
    cores = int(said[0]) if said and said[0].isdigit() else None
    return cores, (said[1] if len(said) > 1 else None)


def local_kernel() -> str | None:
    """This machine's boot id."""
    try:
        return Path(BOOT_ID).read_text().strip()
    except OSError:
        return None


def shared_kernels(samplers: list["RemoteSampler"]) -> dict[str, str]:
    """Server -> the server before it (this machine first) whose kernel it runs on:
    its ``/proc/stat`` and its cores are that one's, counted once."""
    first = {local_kernel(): "localhost"}
    shared = {}
    for sampler in samplers:
        if sampler.kernel is None or sampler.server.name == "localhost":  # this machine
            continue
        if sampler.kernel in first:
            shared[sampler.server.name] = first[sampler.kernel]
        else:
            first[sampler.kernel] = sampler.server.name
    return shared


class RemoteSampler:
    """``remotesample.py`` on ``server`` for its ``interfaces`` and ``processes``
    (name -> PID there), writing ``directory/samples/<server>.csv`` there."""

    def __init__(self, server: Server, directory: Path, interfaces: list[str],
                 processes: dict[str, int], interval: float = 0.1, record=None):
        self.server = server
        self.out = Path(directory) / "samples" / f"{server.name}.csv"
        self.log = Path(directory) / "logs" / f"sampler-{server.name}.log"
        self.interfaces = interfaces
        self.processes = processes
        self.interval = interval
        self.record = record
        self.popen: subprocess.Popen | None = None
        self.pid: int | None = None
        self.clock: dict = {}
        self.cores: int | None = None
        self.kernel: str | None = None  # its boot id

    def command(self) -> list[str]:
        args = [str(self.out), str(self.interval)]
        for name in self.interfaces:
            args += ["--interface", name]
        for name, pid in self.processes.items():
            args += ["--process", f"{name}={pid}"]
        return self.server.ssh(sys.executable, "-m", "qaina_bench.harness.running.remote",
                               "launch", "--log", str(self.log), "--", sys.executable, "-m",
                               "qaina_bench.harness.running.remotesample", *args,
                               lasting=True)

    def start(self):
        """Measure the server's clock offset, then start sampling there; OSError (one
        line) when it does not start."""
        self.clock = clock_offset(self.server)
        self.cores, self.kernel = server_cores(self.server)
        self.popen = subprocess.Popen(self.command(), stdin=subprocess.DEVNULL,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      start_new_session=True)
        line = self.popen.stdout.readline().decode(errors="replace").strip()
        try:
            info = json.loads(line)
            self.pid, started = int(info["pid"]), float(info["started"])
        except (ValueError, KeyError, TypeError):
            self.popen.kill()
            self.popen.wait()
            raise OSError(f"{self.server.name}: its sampler did not start: "
                          f"{line or 'no answer'}")
        if self.record is not None:
            self.record.add_process(self.popen.pid, f"ssh to the sampler on {self.server.name}")
            self.record.add_remote_process(self.server.name, self.server.user, self.pid,
                                           started, "sampler")

    def stop(self):
        """Its last sample taken, it ends (TERM; KILL after 3 s)."""
        if self.pid is None:
            return
        pid, self.pid = self.pid, None
        try:
            subprocess.run(self.server.ssh(
                "sh", "-c", f"kill {pid} 2>/dev/null; for i in $(seq 30); do kill -0 {pid} "
                f"2>/dev/null || exit 0; sleep 0.1; done; kill -9 {pid} 2>/dev/null; true"),
                capture_output=True, timeout=30)
            self.popen.wait(10)
        except (OSError, subprocess.TimeoutExpired):
            self.popen.kill()


def remote_samplers(testbed, processes: dict[str, int], directory: Path, record=None
                    ) -> tuple[dict[str, int], list[RemoteSampler]]:
    """The run's processes (name -> PID here, an ssh session's for a remote one) split
    into those this machine's sampler reads, and a sampler per other server for the
    switch interfaces and processes there."""
    cluster = getattr(testbed, "cluster", None)
    if cluster is None or not cluster.remote:
        return processes, []
    there = dict(getattr(testbed, "remote_pids", {}))  # ssh PID here -> (server, PID)
    interfaces: dict[str, list[str]] = {s.name: [] for s in cluster.remote}
    for sw in testbed.net.switches:
        server = getattr(sw, "server_key", None)
        if server is not None:
            interfaces[server] += [i.name for i in sw.intfList() if i.name != "lo"]
            if getattr(sw, "remote_pid", None):
                there[sw.target.pid] = (server, sw.remote_pid)
    local = {name: pid for name, pid in processes.items() if pid not in there}
    remote = {s.name: {} for s in cluster.remote}
    for name, pid in processes.items():
        if pid in there:
            remote[there[pid][0]][name] = there[pid][1]
    return local, [RemoteSampler(s, directory, interfaces[s.name], remote[s.name],
                                 record=record) for s in cluster.remote]


def merge_samples(writer, samplers: list[RemoteSampler], readings: dict | None = None
                  ) -> dict:
    """Every remote sampler's rows, now here, into ``writer``'s ``timeseries.csv``
    with their server; returns each server's clock offset and how many rows it gave.
    ``readings`` (the CPU ledger's, this machine's window ``began``..``ended``) get the
    remote processes' CPU seconds over that window in place of their ssh sessions',
    ``cores_by_server``: this machine's cores and each server's, ``shared_kernel``:
    the servers that run on the kernel of one before them (``shared_kernels``), and
    ``machine_by_server``: the other kernels' CPU seconds per ``/proc/stat`` state over
    the window."""
    out = {}
    if readings and samplers:
        readings["cores_by_server"] = {"localhost": readings.get("cores"),
                                       **{s.server.name: s.cores for s in samplers}}
        readings["shared_kernel"] = shared_kernels(samplers)
        readings["machine_by_server"] = {}
    for sampler in samplers:
        name = sampler.server.name
        try:
            rows = read_csv(writer.dir / "samples" / f"{name}.csv")
        except OSError:
            rows = []
        for row in rows:
            writer.add_row({**{k: v for k, v in row.items() if v != ""}, "server": name})
        out[name] = {**sampler.clock, "samples": len(rows)}
        if readings:
            offset = sampler.clock.get("offset_s") or 0.0
            began, ended = readings["began"] + offset, readings["ended"] + offset
            for proc, (user, system) in process_cpu(rows, began, ended).items():
                if proc in readings["processes"]:
                    readings["processes"][proc].update(user_s=user, system_s=system,
                                                       server=name)
            machine = machine_cpu(rows, began, ended)
            if machine and name not in readings["shared_kernel"] and name != "localhost":
                readings["machine_by_server"][name] = machine
    return out


def machine_cpu(rows: list[dict], began: float, ended: float) -> dict[str, float]:
    """The server's CPU seconds per ``/proc/stat`` state (``STAT_FIELDS``) from
    ``began`` to ``ended``, between its samples ``around`` them; empty without two
    samples."""
    samples = [(float(r["time"]), r) for r in rows
               if r.get("kind") == "cpu" and r.get("softirq_s") not in (None, "")]
    if len(samples) < 2:
        return {}
    first, last = around(samples, began, ended)
    return {k: float(last[1].get(f"{k}_s") or 0) - float(first[1].get(f"{k}_s") or 0)
            for k in STAT_FIELDS}


def process_cpu(rows: list[dict], began: float, ended: float) -> dict[str, tuple]:
    """(user, system) CPU seconds of each sampled process from ``began`` to ``ended``
    (the server's clock): its last sample at or before ``began`` (else its first) to
    its first at or after ``ended`` (else its last, taken when the sampler stopped)."""
    by_proc: dict[str, list[tuple]] = {}
    for r in rows:
        if r.get("kind") == "proc" and r.get("user_s") not in (None, ""):
            by_proc.setdefault(r["process"], []).append(
                (float(r["time"]), float(r["user_s"]), float(r["system_s"])))
    out = {}
    for name, samples in by_proc.items():
        first, last = around(samples, began, ended)
        out[name] = (max(0.0, last[1] - first[1]), max(0.0, last[2] - first[2]))
    return out


def around(samples: list[tuple], began: float, ended: float) -> tuple[tuple, tuple]:
    """Of ``samples`` (tuples, the time first), the two that span ``began`` to
    ``ended``: the last at or before ``began`` (else the first) and the first at or
    after ``ended`` (else the last, taken when the sampler stopped)."""
    samples = sorted(samples, key=lambda s: s[0])
    first = max((s for s in samples if s[0] <= began), default=samples[0], key=lambda s: s[0])
    last = min((s for s in samples if s[0] >= ended), default=samples[-1], key=lambda s: s[0])
    return first, last

