"""``--host-cpu`` on a cluster (``--cluster``): every host limited on its own server.

Mininet's ``CPULimitedHost`` runs its cgroup tools on the machine the run starts on,
so a host of another server could not be limited through it. ``ClusterLimitedHost``
does what ``LimitedHost`` (``cpulimit.py``) does here on the host's server, through
that server's shell (this machine's for a local host): a cgroup v1 per host in the
``cpu``, ``cpuacct`` and ``cpuset`` hierarchies, its CFS quota ``cores`` x 100 ms per
100 ms period (read back and checked), the host's shell moved into it, and everything
the host starts put there by ``mnexec -g``. The cgroups are in the run record under
their server (listed before they are made) and removed with the host, by the
record's removal after a ``kill -9`` (``remote remove`` there), and on Ctrl-C.
"""

from __future__ import annotations

import time

from .cluster import ClusterError, ClusterHost
from .cpulimit import CGROUP_ROOT, cgroup_dirs

PERIOD_US = 100_000


class ClusterLimitedHost(ClusterHost):
    """A host of a cluster whose processes share at most ``cores`` of CPU time per
    second, by a cgroup on its server."""

    def __init__(self, name, cores: float = 1.0, record=None, **params):
        self.cores = cores
        self.record = record
        ClusterHost.__init__(self, name, **params)

    def server_sh(self, line: str) -> str:
        """Shell command line ``line`` on the host's server, outside its namespace."""
        return self.rcmd(line) if self.isRemote else self.rcmd(["sh", "-c", line])

    @property
    def cgroup_dirs(self) -> list[str]:
        """Its cgroup's directories on its server, one per hierarchy."""
        return [str(d) for d in cgroup_dirs(self.name)]

    def finishInit(self):
        """The shell is up: make its cgroup there, move the shell into it, set the
        quota and check it; ClusterError (one line) if the server refuses."""
        ClusterHost.finishInit(self)
        if self.record is not None:  # listed before they exist
            if self.isRemote:
                self.record.add_remote_cgroups(self.server, self.user, self.cgroup_dirs)
            else:
                self.record.add_cgroups(self.cgroup_dirs)
            self.record.save()
        want = round(PERIOD_US * self.cores)
        name = self.name
        out = self.server_sh(f"cgcreate -g cpu,cpuacct,cpuset:/{name} && "
                        f"cgclassify -g cpu,cpuacct:/{name} {self.pid} && "
                        f"cgset -r cpu.cfs_period_us={PERIOD_US} {name} && "
                        f"cgset -r cpu.cfs_quota_us={want} {name} && "
                        f"cat {CGROUP_ROOT}/cpu/{name}/cpu.cfs_quota_us 2>&1")
        got = (out.strip().splitlines() or ["no answer"])[-1]
        if got != str(want):
            raise ClusterError(f"{self.server}: host {name}: cgroup cpu quota is not "
                               f"{want} us per {PERIOD_US} us: {got}")

    def popen(self, *args, **kwargs):
        """As the cluster host's, the process put into the host's cgroup (``mnexec -g``;
        a command run outside the host, ``mncmd=[]``, as it is)."""
        mncmd = kwargs.pop("mncmd", ["mnexec", "-da", str(self.pid)])
        kwargs["mncmd"] = mncmd[:1] + ["-g", self.name] + mncmd[1:] if mncmd else mncmd
        return ClusterHost.popen(self, *args, **kwargs)

    def quota_us(self) -> int:
        """The quota as its server has it (-1: none)."""
        out = self.server_sh(f"cat {CGROUP_ROOT}/cpu/{self.name}/cpu.cfs_quota_us")
        return int(out.strip().splitlines()[-1])

    def cleanup(self):
        """Mininet's clean-up, then the host's cgroup in every hierarchy there (a
        cgroup that stays busy is left for the run's record)."""
        ClusterHost.cleanup(self)
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:
            out = self.server_sh("; ".join(f"rmdir {d} 2>/dev/null" for d in self.cgroup_dirs)
                            + "; " + " || ".join(f"test -d {d}" for d in self.cgroup_dirs)
                            + " && echo busy; true")
            if "busy" not in out:
                return
            time.sleep(0.1)
