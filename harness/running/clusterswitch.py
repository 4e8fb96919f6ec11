"""The QAINA switch on a server of a cluster (``--cluster``).

``ClusterSwitch`` is ``QainaSwitch`` on Mininet's ``RemoteMixin``: on this machine it
is the plain switch; on another server its switch program (the embedded switch) is
started there through ``remote launch``, listens for P4Runtime on the server's address
at a port that server chose, and is recorded, and stopped, by its PID there.
"""

from __future__ import annotations

import sys

from ..switches.targets import make_target
from .cluster import ClusterNode
from .network import QainaSwitch, quiet_interface


class ClusterSwitch(ClusterNode, QainaSwitch):
    """A QAINA switch that may run on another server."""

    remote_pid: int | None = None

    def start(self, controllers):
        if not self.isRemote:
            return QainaSwitch.start(self, controllers)
        if self.target_kind != "embedded":
            raise RuntimeError(f"{self.name} on {self.server}: a switch on another server "
                               "runs the embedded target only (BMv2 runs on this machine)")
        interfaces = {self.ports[intf]: intf.name for intf in self.intfList()
                      if intf.name != "lo"}
        for ifname in interfaces.values():
            quiet_interface(ifname, run=lambda cmd, **kw: self.cmd(" ".join(cmd)))
        port = int(self.cmd(f"{sys.executable} -m qaina_bench.harness.running.remote port")
                   .strip().splitlines()[-1])
        self.target = make_target(self.target_kind, self.name, interfaces, port,
                                  self.device_id, self.log_dir / f"{self.name}.log",
                                  words=self.words)
        self.target.grpc_addr = f"{self.serverIP}:{port}"
        popen, pid, started = self.launch(self.target.command(), self.target.log_path)
        self.target.proc = popen  # the ssh session: it ends when the switch does
        self.remote_pid = pid
        if self.record is not None:
            self.record.add_switch(self.name, self.target.grpc_addr, self.device_id,
                                   self.target_kind)
            self.record.add_process(popen.pid, f"ssh to switch {self.name} on {self.server}")
            self.record.add_remote_process(self.server, self.user, pid, started,
                                           f"switch {self.name}")

    def stop(self, deleteIntfs=True):
        if self.remote_pid is not None:
            self.kill_remote(self.remote_pid)
            self.remote_pid = None
        QainaSwitch.stop(self, deleteIntfs)
