"""The QAINA switch on a server of a cluster (``--cluster``).

``ClusterSwitch`` is ``QainaSwitch`` on Mininet's ``RemoteMixin``: on this machine it
is the plain switch; on another server its switch program (the embedded switch or
BMv2's ``simple_switch_grpc``) is started there through ``remote launch``, listens for
P4Runtime on the server's address at a port that server chose, and is recorded, and
stopped, by its PID there. Its P4Runtime port is kept for this machine's address (as
that server sees it) and the server's loopback by an nftables table made there
(``RemoteP4RuntimeGuard``), and a remote BMv2's Thrift port (also chosen there) for that
server's loopback by another; both are recorded under the server before they are made
and removed with the switch.
"""

from __future__ import annotations

import sys

from ..switches.firewall import FirewallError
from ..switches.targets import TargetError, make_target
from .cluster import ClusterNode, Server, each_then_first_failure
from .hoststack import quiet_interface
from .network import QainaSwitch
from .remotebmv2 import RemoteBMv2Target
from .remoteguard import RemoteP4RuntimeGuard, harness_address


class ClusterSwitch(ClusterNode, QainaSwitch):
    """A QAINA switch that may run on another server."""

    remote_pid: int | None = None
    p4rt_guard: RemoteP4RuntimeGuard | None = None
    guards: list = []
    launching = False

    def start(self, controllers):
        if not self.isRemote:
            return QainaSwitch.start(self, controllers)
        interfaces = {self.ports[intf]: intf.name for intf in self.intfList()
                      if intf.name != "lo"}
        for ifname in interfaces.values():
            quiet_interface(ifname, run=lambda cmd, **kw: self.cmd(" ".join(cmd)))
        port, thrift_port = self._remote_ports()
        log = self.log_dir / f"{self.name}.log"
        if self.target_kind == "bmv2":
            self.target = RemoteBMv2Target(self.name, interfaces, port, self.device_id, log,
                                           thrift_port=thrift_port, words=self.words,
                                           log_packets=self.log_packets,
                                           server=Server(self.server, self.user))
        else:
            self.target = make_target(self.target_kind, self.name, interfaces, port,
                                      self.device_id, log, words=self.words)
        self.target.grpc_addr = f"{self.serverIP}:{port}"
        self._record_switch(port, thrift_port)
        guards = [self._p4runtime_guard(port)] + [
            g for g in [getattr(self.target, "guard", None)] if g is not None]
        try:
            for guard in guards:
                guard.close_port()
            popen = self.launch_begin(self.target.command(), self.target.log_path)
        except BaseException as exc:
            for guard in guards:
                guard.remove()
            if isinstance(exc, FirewallError):
                raise TargetError(f"{self.name}: {exc}") from None
            raise
        self.target.proc = popen  # the ssh session: it ends when the switch does
        self.guards = guards
        self.launching = True  # its PID there not read yet (``batchStartup``)
        if self.record is not None:
            self.record.add_process(popen.pid, f"ssh to switch {self.name} on {self.server}")

    @classmethod
    def batchStartup(cls, switches):
        """After Mininet started every switch: the remote ones' PIDs, read once all of
        them are starting (each started at once); the first failure raised then."""
        each_then_first_failure(sw.launched for sw in switches if sw.launching)
        return switches

    def launched(self):
        """Read the remote switch's PID (``start`` started it) and record it there; if
        it did not start, its guards go."""
        self.launching = False
        try:
            pid, started = self.launch_end(self.target.proc, f"switch {self.name}")
        except RuntimeError:
            for guard in self.guards:
                guard.remove()
            raise
        self.remote_pid = pid
        if self.record is not None:
            self.record.add_remote_process(self.server, self.user, pid, started,
                                           f"switch {self.name}")

    def _p4runtime_guard(self, port: int) -> RemoteP4RuntimeGuard:
        """The guard of the switch's P4Runtime port on its server (not made yet),
        listed in the run record under the server."""
        server = Server(self.server, self.user)
        try:
            allowed = harness_address(server)
        except FirewallError as exc:
            raise TargetError(f"{self.name}: {exc}") from None
        self.p4rt_guard = RemoteP4RuntimeGuard(port, allowed, server)
        if self.record is not None:
            self.record.add_remote_nft_table(self.server, self.user, self.p4rt_guard.family,
                                             self.p4rt_guard.table)
        return self.p4rt_guard

    def _remote_ports(self) -> tuple[int, int | None]:
        """Free ports of the server: P4Runtime's, and BMv2's Thrift (a different one;
        None for the embedded switch)."""
        ports: list[int] = []
        while len(ports) < (2 if self.target_kind == "bmv2" else 1):
            out = self.cmd(f"{sys.executable} -m qaina_bench.harness.running.remote port")
            port = int(out.strip().splitlines()[-1])
            if port not in ports:
                ports.append(port)
        return ports[0], (ports[1:] or [None])[0]

    def _record_switch(self, port: int, thrift_port: int | None):
        """The switch's address and ports in the run record; for BMv2 the guard table
        on its server too (listed before it is made)."""
        if self.record is None:
            return
        self.record.add_switch(self.name, self.target.grpc_addr, self.device_id,
                               self.target_kind)
        self.record.add_port(port, f"P4Runtime of {self.name} on {self.server}")
        if self.target_kind == "bmv2":
            self.record.add_port(thrift_port, f"Thrift of {self.name} on {self.server}")
            guard = self.target.guard
            self.record.add_remote_nft_table(self.server, self.user, guard.family,
                                             guard.table)
        self.record.save()

    def stop_soon(self):
        if not self.isRemote:
            return QainaSwitch.stop_soon(self)
        if self.remote_pid is not None:  # (one still launching: ``stop`` reads its PID)
            self.rcmd(f"kill {self.remote_pid} 2>/dev/null; true")

    def stop(self, deleteIntfs=True):
        if self.launching:  # stopped before Mininet read the PID (another switch failed)
            try:
                self.launched()
            except RuntimeError:
                pass
        if self.remote_pid is not None:
            self.kill_remote(self.remote_pid)
            self.remote_pid = None
        if self.p4rt_guard is not None:
            self.p4rt_guard.remove()
            self.p4rt_guard = None
        QainaSwitch.stop(self, deleteIntfs)
