"""nftables guards of a switch's control ports on another server of a cluster.

A switch on another server listens for P4Runtime on that server's address, where
anyone who reaches the server could connect; a BMv2 there also serves Thrift on every
address. ``RemoteGuard`` makes a guard's table (``firewall.py``) on the switch's
server over ssh, and deletes it there: ``RemoteP4RuntimeGuard`` keeps the P4Runtime
port for that server's loopback and for the address this machine reaches it from
(``harness_address``: the client address of ``$SSH_CONNECTION`` there),
``RemoteThriftGuard`` (``remotebmv2.py``) keeps the Thrift port for its loopback.
The run records each table under its server before it is made, so the teardown,
Ctrl-C and ``clean`` after a ``kill -9`` remove it there.
"""

from __future__ import annotations

import subprocess

from ..switches.firewall import FirewallError, P4RuntimeGuard
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


def harness_address(server: Server) -> str:
    """The address ``server`` sees this machine's connections come from: the client
    address of its ``$SSH_CONNECTION`` (what P4Runtime from here comes from too, by
    the same route). FirewallError when the server does not say."""
    res = run_on(server, ["sh", "-c", "echo $SSH_CONNECTION"])
    words = res.stdout.split() if res.returncode == 0 else []
    if len(words) != 4:
        raise FirewallError(f"{server.name} did not tell the address this machine reaches "
                            f"it from ($SSH_CONNECTION: {res.stdout.strip() or 'empty'}"
                            f"{'; ' + res.stderr.strip()[-200:] if res.stderr.strip() else ''})")
    return words[0].removeprefix("::ffff:")


class RemoteGuard:
    """A guard's nftables table (``script()``, ``family``, ``table``, ``port``), made
    and deleted on ``self.server``; ``what`` names the port, ``needs`` says what for."""

    server: Server
    what = "a control"
    needs = "a switch there needs it"

    def close_port(self):
        res = run_on(self.server, ["sh", "-c", f"command -v nft >/dev/null || exit 3; "
                                   f"nft delete table {self.family} {self.table} "
                                   f"2>/dev/null; nft -f -"], self.script())
        if res.returncode == 3:
            raise FirewallError(f"{self.server.name} has no nft: {self.needs} "
                                "(apt-get install nftables)")
        if res.returncode != 0:
            raise FirewallError(f"nft on {self.server.name} could not close {self.what} port "
                                f"{self.port}: {(res.stderr or res.stdout).strip()[-200:]}")

    def remove(self):
        run_on(self.server, ["nft", "delete", "table", self.family, self.table])

    def exists(self) -> bool:
        res = run_on(self.server, ["nft", "list", "table", self.family, self.table])
        return res.returncode == 0


class RemoteP4RuntimeGuard(RemoteGuard, P4RuntimeGuard):
    """``P4RuntimeGuard``'s table on ``server``: its P4Runtime port open to ``allowed``
    (this machine) and to that server's loopback only."""

    what = "P4Runtime"
    needs = ("a switch there needs it to keep its P4Runtime port for this machine and "
             "loopback")

    def __init__(self, port: int, allowed: str, server: Server):
        P4RuntimeGuard.__init__(self, port, allowed)
        self.server = server
