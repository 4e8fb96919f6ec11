"""BMv2 (``simple_switch_grpc``) on another server of a cluster (``--cluster``).

``RemoteBMv2Target`` is ``BMv2Target`` whose process runs on ``server``: the switch
itself is started there by ``ClusterSwitch`` through ``remote launch`` (its ports
chosen by that server, P4Runtime on the server's address); the p4c JSON compiles
here (or, when this machine has no p4c, with the server's p4c over ssh: the source
in, the files back, nothing left there) and reaches the switch over P4Runtime, so no
file of it is needed there. What talks to its Thrift port runs on the server too:
``simple_switch_CLI`` over ssh to 127.0.0.1 there, and the nftables guard that keeps
the port for that server's loopback (``RemoteThriftGuard``).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from ..switches.firewall import ThriftGuard
from ..switches.targets import BMv2Target, TargetError, compile_p4
from .cluster import Server
from .remoteguard import RemoteGuard, run_on


class RemoteThriftGuard(RemoteGuard, ThriftGuard):
    """``ThriftGuard``'s nftables table, made and deleted on ``server``."""

    what = "Thrift"
    needs = "BMv2 there needs it to keep its Thrift port for loopback"

    def __init__(self, port: int, server: Server):
        ThriftGuard.__init__(self, port)
        self.server = server


class RemoteBMv2Target(BMv2Target):
    """A BMv2 switch whose process runs on ``server`` (started by ``ClusterSwitch``)."""

    def __init__(self, *args, server: Server, **kwargs):
        super().__init__(*args, **kwargs)
        self.server = server
        self.guard = RemoteThriftGuard(self.thrift_port, server)

    def command(self) -> list[str]:
        """The switch's command line, run there (``doctor --cluster`` and ``up``
        checked that the server has ``simple_switch_grpc``)."""
        return self.switch_command()

    def cli_command(self) -> list[str]:
        return self.server.ssh(*super().cli_command())

    def compiled(self) -> tuple[Path, Path]:
        """p4c's files, compiled here, or on the switch's server when this machine has
        no p4c (``compile_p4``'s cache here holds them either way)."""
        if self.p4c_there() is None:
            return super().compiled()
        try:
            return compile_p4(self.words, on=self.server.ssh)
        except TargetError as exc:
            raise TargetError(f"{self.name}: this machine has no p4c, and p4c on "
                              f"{self.server.name}: {exc}") from None

    def p4c_there(self) -> str | None:
        """The server whose p4c compiles the program: None when this machine's does."""
        return None if shutil.which("p4c") else self.server.name

    def describe(self) -> dict:
        """As ``BMv2Target``, with the server's BMv2 (and its p4c when this machine
        has none)."""
        res = run_on(self.server, ["simple_switch_grpc", "--version"])
        lines = res.stdout.strip().splitlines() if res.returncode == 0 else []
        out = {**super().describe(), "simple_switch_grpc": {
            "server": self.server.name, "version": lines[0] if lines else None}}
        if self.p4c_there():
            res = run_on(self.server, ["p4c", "--version"])
            lines = res.stdout.strip().splitlines() if res.returncode == 0 else []
            out["p4c"] = {"server": self.server.name, "version": lines[0] if lines else None}
        return out

    def stop(self, timeout: float = 5.0):
        """The ssh session ended, the notifications socket and the guard gone there
        (``ClusterSwitch`` stops the switch process itself by its PID there)."""
        super().stop(timeout)
        run_on(self.server, ["rm", "-f", self.notifications[len("ipc://"):]])
