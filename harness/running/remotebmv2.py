"""BMv2 (``simple_switch_grpc``) on another server of a cluster (``--cluster``).

``RemoteBMv2Target`` is ``BMv2Target`` whose process runs on ``server``: the switch
itself is started there by ``ClusterSwitch`` through ``remote launch`` (its ports
chosen by that server, P4Runtime on the server's address); the p4c JSON still
compiles here and reaches the switch over P4Runtime, so no file of it is needed
there. What talks to its Thrift port runs on the server too: ``simple_switch_CLI``
over ssh to 127.0.0.1 there, and the nftables guard that keeps the port for that
server's loopback (``RemoteThriftGuard``).
"""

from __future__ import annotations

import subprocess

from ..switches.firewall import FirewallError, ThriftGuard
from ..switches.targets import BMv2Target
from .cluster import Server


def run_on(server: Server, cmd: list[str], stdin: str = "",
           timeout: float = 30) -> subprocess.CompletedProcess:
    """``cmd`` on ``server`` over ssh; its output as text (a failure to reach the
    server is a non-zero return code with ssh's message)."""
    try:
        return subprocess.run(server.ssh(*cmd), input=stdin, capture_output=True, text=True,
                              timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return subprocess.CompletedProcess(cmd, 255, "", str(exc))


class RemoteThriftGuard(ThriftGuard):
    """``ThriftGuard``'s nftables table, made and deleted on ``server``."""

    def __init__(self, port: int, server: Server):
        super().__init__(port)
        self.server = server

    def close_port(self):
        res = run_on(self.server, ["sh", "-c", f"command -v nft >/dev/null || exit 3; "
                                   f"nft delete table {self.family} {self.table} "
                                   f"2>/dev/null; nft -f -"], self.script())
        if res.returncode == 3:
            raise FirewallError(f"{self.server.name} has no nft: BMv2 there needs it to keep "
                                "its Thrift port for loopback (apt-get install nftables)")
        if res.returncode != 0:
            raise FirewallError(f"nft on {self.server.name} could not close Thrift port "
                                f"{self.port}: {(res.stderr or res.stdout).strip()[-200:]}")

    def remove(self):
        run_on(self.server, ["nft", "delete", "table", self.family, self.table])

    def exists(self) -> bool:
        res = run_on(self.server, ["nft", "list", "table", self.family, self.table])
        return res.returncode == 0


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

    def describe(self) -> dict:
        """As ``BMv2Target`` (p4c is this machine's), with the server's BMv2."""
        res = run_on(self.server, ["simple_switch_grpc", "--version"])
        lines = res.stdout.strip().splitlines() if res.returncode == 0 else []
        return {**super().describe(), "simple_switch_grpc": {
            "server": self.server.name, "version": lines[0] if lines else None}}

    def stop(self, timeout: float = 5.0):
        """The ssh session ended, the notifications socket and the guard gone there
        (``ClusterSwitch`` stops the switch process itself by its PID there)."""
        super().stop(timeout)
        run_on(self.server, ["rm", "-f", self.notifications[len("ipc://"):]])
