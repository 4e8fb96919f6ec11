"""CPU time from /proc: what the processes of a run used and waited for, what the
machine's cores did, and ``CpuLedger``, the CPU seconds each component of a run spent.

* ``machine_times``: seconds all cores together spent in each state since boot
  (``/proc/stat``, its first line).
* ``SchedClock``: seconds a process's threads spent waiting for a CPU while runnable
  (``/proc/<pid>/task/*/schedstat``, the scheduler's run-queue delay), kept monotone
  when threads come and go.
* ``process_times``: user and system seconds of a process, its exited threads and the
  children it reaped (``/proc/<pid>/stat`` through psutil).
"""

from __future__ import annotations

import gzip
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
STAT_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def machine_times() -> dict[str, float]:
    """Seconds all cores together spent in each state of ``STAT_FIELDS`` since boot."""
    with open("/proc/stat") as f:
        values = f.readline().split()[1:1 + len(STAT_FIELDS)]
    return {name: int(v) / CLOCK_TICKS for name, v in zip(STAT_FIELDS, values)}


def irq_time_apart() -> bool | None:
    """Whether the kernel keeps interrupt time out of the processes' system time
    (``CONFIG_IRQ_TIME_ACCOUNTING``); None when its configuration is not readable.
    Without it, a tick that lands in a softirq is charged both to the softirq column
    of /proc/stat and to the system time of the process it interrupted."""
    try:
        with gzip.open("/proc/config.gz", "rt") as f:
            config = f.read()
    except OSError:
        return None
    return "CONFIG_IRQ_TIME_ACCOUNTING=y" in config


def process_times(proc: psutil.Process) -> tuple[float, float]:
    """(user, system) seconds of ``proc``: all its threads, exited ones included, and
    the children it reaped. Raises psutil.Error when the process is gone."""
    t = proc.cpu_times()
    return t.user + t.children_user, t.system + t.children_system


class SchedClock:
    """Run-queue delay of one process: seconds its threads were runnable but not
    running. The kernel keeps it per thread; a thread that exits takes its count
    along, so the clock keeps the last value it saw of every thread."""

    def __init__(self, pid: int):
        self.tasks = Path(f"/proc/{pid}/task")
        self._seen: dict[str, float] = {}

    def wait_s(self) -> float:
        try:
            tids = os.listdir(self.tasks)
        except OSError:
            return sum(self._seen.values())
        for tid in tids:
            try:
                fields = (self.tasks / tid / "schedstat").read_text().split()
            except OSError:
                continue  # the thread ended between listing and reading
            self._seen[tid] = int(fields[1]) / 1e9
        return sum(self._seen.values())


@dataclass
class Tracked:
    """One process of a run whose CPU time is accounted."""

    name: str
    component: str  # "agents", "switches" or "ps"
    proc: psutil.Process
    job: int | None = None  # the job it serves; None: every job (a switch)
    start: tuple[float, float] | None = None  # (user, system) at the window's start
    end: tuple[float, float] | None = None  # at its exit, or at the window's end


COMPONENTS = ("agents", "switches", "ps", "harness")


@dataclass
class CpuLedger:
    """CPU seconds (user, system) each process of a run spent during the run's
    window, from ``begin`` (the agents are told to go) to ``end`` (the last agent
    exited, or the run was stopped).

    Every process is read at ``begin`` and once more at the end of its part: an agent
    or parameter server that exits is read as a zombie, after it exited and before it
    is reaped, when /proc still holds its final times (``poll`` asks the kernel with
    ``waitid(WNOWAIT)`` whether the process exited, reads it, and only then lets
    ``Popen`` reap it; a process is never reaped anywhere else while the run goes; an
    agent forked by the agent starter, ``starter.py``, comes with its final times);
    switches, and whatever is still running at ``end``, are read at ``end``, just
    before the run stops them. The harness's own times (its threads, the sampler's
    too, without its children) and the machine's interrupt time (``/proc/stat``,
    system-wide) are read at ``begin`` and ``end``.
    """

    tracked: dict[int, Tracked] = field(default_factory=dict)
    began: float | None = None
    ended: float | None = None
    _harness: list = field(default_factory=list)  # (user, system) at begin and end
    _machine: list = field(default_factory=list)  # machine_times() at begin and end

    def watch(self, name: str, component: str, pid: int | None, job: int | None = None):
        if pid is None:
            return
        try:
            self.tracked[pid] = Tracked(name, component, psutil.Process(pid), job)
        except psutil.Error:
            pass

    def begin(self):
        self.began = time.time()
        self._harness = [self._own_times()]
        self._machine = [machine_times()]
        for t in self.tracked.values():
            t.start = self._read(t)

    def poll(self, popen) -> int | None:
        """``popen.poll()``, reading the process's final times before it is reaped."""
        if popen.returncode is not None:
            return popen.returncode
        if hasattr(popen, "final_times"):  # a fork of the agent starter: it reports them
            code = popen.poll()
            t = self.tracked.get(popen.pid)
            if code is not None and t is not None and t.end is None and self.began:
                t.end = popen.final_times
            return code
        try:
            exited = os.waitid(os.P_PID, popen.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:  # reaped elsewhere already
            return popen.poll()
        if exited is None:
            return None
        t = self.tracked.get(popen.pid)
        if t is not None and t.end is None and self.began is not None:
            t.end = self._read(t)
        return popen.poll()

    def end(self):
        """Close the window: read every process that has not exited yet."""
        if self.began is None or self.ended is not None:
            return
        for t in self.tracked.values():
            if t.end is None:
                t.end = self._read(t)
        self._harness.append(self._own_times())
        self._machine.append(machine_times())
        self.ended = time.time()

    @staticmethod
    def _read(t: Tracked) -> tuple[float, float] | None:
        try:
            return process_times(t.proc)
        except psutil.Error:
            return None

    @staticmethod
    def _own_times() -> tuple[float, float]:
        t = os.times()  # this process's threads; children are counted where they belong
        return t.user, t.system

    def readings(self) -> dict | None:
        """The raw figures of the window (``harness/results/fidelity.py`` derives the rest)."""
        if self.ended is None:
            return None
        processes = {}
        for t in self.tracked.values():
            ok = t.start is not None and t.end is not None
            processes[t.name] = {
                "component": t.component,
                "user_s": t.end[0] - t.start[0] if ok else None,
                "system_s": t.end[1] - t.start[1] if ok else None}
        (hu0, hs0), (hu1, hs1) = self._harness
        m0, m1 = self._machine
        return {"window_s": self.ended - self.began, "began": self.began,
                "ended": self.ended, "cores": psutil.cpu_count(),
                "processes": processes,
                "harness": {"user_s": hu1 - hu0, "system_s": hs1 - hs0},
                "machine": {k: m1[k] - m0[k] for k in STAT_FIELDS},
                "irq_time_apart": irq_time_apart()}
