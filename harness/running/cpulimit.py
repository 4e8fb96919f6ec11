"""CPU isolation of the Mininet hosts (``up --host-cpu CORES``), as Mininet-HiFi does it.

Every host gets a cgroup of its own with a CFS bandwidth limit (quota per period)
through Mininet's ``CPULimitedHost``: its shell is moved into the cgroup and every
process it starts (``popen``: agents, parameter servers) is put there by ``mnexec
-g``, so a host's agent and everything else it runs share ``CORES`` of CPU time per
second. The switches run outside the hosts and are not limited.

Mininet 2.3 does this with cgroup v1 only: ``cgcreate``/``cgset``/``cgclassify``
from ``cgroup-tools`` and ``mnexec -g``, which writes to ``/sys/fs/cgroup/cpu/<group>/
tasks``. ``limit_problem`` says in one line why that cannot work on a machine (no
v1 ``cpu`` controller with CFS bandwidth, cgroup v2 only, tools missing).
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from mininet.node import CPULimitedHost
from mininet.util import numCores

CGROUP_ROOT = Path("/sys/fs/cgroup")
#: the v1 hierarchies Mininet's host cgroup is made in (cpuset stays unset)
HIERARCHIES = ("cpu", "cpuacct", "cpuset")
TOOLS = ("cgcreate", "cgset", "cgget", "cgclassify")
MIN_CORES = 0.01  # CFS takes quotas of at least 1 ms in a 100 ms period


def limit_problem(root: Path | None = None) -> str | None:
    """Why hosts cannot be CPU-limited here, in one line; None when they can."""
    root = root or CGROUP_ROOT
    if not (root / "cpu" / "cpu.cfs_quota_us").exists():
        if (root / "cgroup.controllers").exists():
            return ("--host-cpu needs the cgroup v1 cpu controller (Mininet 2.3's "
                    "CPULimitedHost and mnexec -g write /sys/fs/cgroup/cpu/<host>/tasks), "
                    "and this machine mounts cgroup v2 only: boot it with "
                    "systemd.unified_cgroup_hierarchy=0, or run without --host-cpu")
        return ("--host-cpu needs the cgroup v1 cpu controller with CFS bandwidth "
                f"({root}/cpu/cpu.cfs_quota_us is missing: a kernel without "
                "CONFIG_CFS_BANDWIDTH, or cgroups not mounted); run without --host-cpu")
    if not os.access(root / "cpu", os.W_OK):
        return (f"--host-cpu makes a cgroup per host in {root}/cpu, which is read-only "
                "here (a container's cgroups: remount them read-write); run without "
                "--host-cpu")
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        return (f"--host-cpu needs {missing[0]} (Mininet's CPULimitedHost uses it): "
                "apt-get install cgroup-tools")
    return None


def cgroup_dirs(host: str) -> list[Path]:
    """The directories of a limited host's cgroup, one per hierarchy."""
    return [CGROUP_ROOT / h / host for h in HIERARCHIES]


def process_cgroups(host: str) -> list[str]:
    """The cgroups a process started on limited host ``host`` joins: its CPU limit
    and its accounting (as ``cgclassify`` moves the host's shell)."""
    return [str(CGROUP_ROOT / h / host) for h in ("cpu", "cpuacct")]


def quota_us(host: str) -> int:
    """The CFS quota of a limited host's cgroup, microseconds per period (-1: none)."""
    return int((CGROUP_ROOT / "cpu" / host / "cpu.cfs_quota_us").read_text())


class LimitedHost(CPULimitedHost):
    """A Mininet host whose processes share at most ``cores`` of CPU time per second
    (``cores`` = 0.5: half of one core), whichever cores they run on."""

    def __init__(self, name, cores: float = 1.0, **params):
        # Mininet's first CPULimitedHost mounts cpuset again when /proc/mounts does not
        # name it as it expects; limit_problem has checked the hierarchies instead.
        CPULimitedHost.inited = True
        self.cores = cores
        # CPULimitedHost takes a share of the whole machine: quota = period x f x cores
        super().__init__(name, cpu=cores / numCores(), **params)

    def config(self, **params):
        r = super().config(**params)
        want = round(self.period_us * self.cores)
        got = quota_us(self.name)
        if abs(got - want) > 1:
            raise RuntimeError(f"host {self.name}: cgroup cpu quota is {got} us, not "
                               f"{want} us per {self.period_us} us (cgset failed)")
        return r

    def cleanup(self):
        """Mininet's own clean-up, then the host's cgroup in every hierarchy
        (``cgdelete`` of cgroup-tools 2.0 removes only the first hierarchy's when the
        controllers are mounted apart, and Mininet exits the program when it fails);
        a cgroup that stays busy is left for the run's record to report."""
        super(CPULimitedHost, self).cleanup()
        deadline = time.monotonic() + 3.0
        while not remove_cgroup(self.name) and time.monotonic() < deadline:
            time.sleep(0.1)


def remove_cgroup(host: str) -> bool:
    """Remove a limited host's cgroup wherever it still exists; True when it is gone
    (a cgroup with tasks left cannot be removed yet)."""
    for d in cgroup_dirs(host):
        try:
            d.rmdir()
        except FileNotFoundError:
            pass
        except OSError:
            return False
    return True
