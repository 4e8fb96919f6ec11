"""BMv2's Thrift port closed to everything but loopback, for as long as a switch runs.

``simple_switch_grpc`` serves its Thrift API (``simple_switch_CLI``: tables,
registers, ``reset_state``) on every address of the machine, and BMv2 has no option
to bind it elsewhere; the P4Runtime servers of both targets bind 127.0.0.1. So before
a BMv2 switch starts, ``ThriftGuard`` adds an nftables table of the ``inet`` family
(IPv4 and IPv6) whose input chain rejects, with a TCP reset, every connection to the
switch's Thrift port that does not arrive on ``lo``; the harness's own
``simple_switch_CLI`` connects to 127.0.0.1, which does. The table is named after the
process that made it and the port, so two runs never share one, and it is removed
when the switch stops; a run records it (``RunRecord.add_nft_table``), so ``clean``
removes it after a ``kill -9``.

``P4RuntimeGuard`` is the same for a P4Runtime port that listens on a server's own
address (a switch on another server of a cluster): the port stays open to loopback
and to the one address the harness connects from; ``harness/running/remoteguard.py``
makes both kinds of table on a switch's server.
"""

from __future__ import annotations

import os
import shutil
import subprocess

FAMILY = "inet"
TABLE_PREFIX = "qaina_thrift_"
P4RT_PREFIX = "qaina_p4rt_"


class FirewallError(RuntimeError):
    """nft is missing or refused the guard's table."""


def nft_available() -> bool:
    return shutil.which("nft") is not None


def table_exists(family: str, table: str) -> bool:
    if not nft_available():
        return False
    res = subprocess.run(["nft", "list", "table", family, table], capture_output=True)
    return res.returncode == 0


def delete_table(family: str, table: str) -> bool:
    """Delete an nftables table; whether it was there."""
    if not nft_available():
        return False
    res = subprocess.run(["nft", "delete", "table", family, table], capture_output=True)
    return res.returncode == 0


class ThriftGuard:
    """The nftables table that keeps one Thrift port for loopback only."""

    def __init__(self, port: int, owner: int | None = None):
        self.port = port
        self.family = FAMILY
        self.table = f"{TABLE_PREFIX}{owner or os.getpid()}_{port}"

    def script(self) -> str:
        """The nft commands that make the table (one transaction)."""
        t = f"{self.family} {self.table}"
        return (f"add table {t}\n"
                f"add chain {t} input {{ type filter hook input priority -10 ; "
                f"policy accept ; }}\n"
                f"add rule {t} input tcp dport {self.port} iif != lo counter "
                f"reject with tcp reset\n")

    def close_port(self):
        """Add the table; raises FirewallError if nft cannot."""
        if not nft_available():
            raise FirewallError("the bmv2 target needs nft to keep its Thrift port "
                                "(open on every address) for loopback only: "
                                "apt-get install nftables")
        delete_table(self.family, self.table)  # a dead process's, with our pid and port
        res = subprocess.run(["nft", "-f", "-"], input=self.script(), text=True,
                             capture_output=True)
        if res.returncode != 0:
            raise FirewallError(f"nft could not close Thrift port {self.port} to the "
                                f"network: {res.stderr.strip() or res.stdout.strip()}")

    def remove(self):
        delete_table(self.family, self.table)

    def exists(self) -> bool:
        return table_exists(self.family, self.table)


class P4RuntimeGuard(ThriftGuard):
    """The nftables table that keeps a P4Runtime port for loopback and one address
    (the harness's, as the switch's server sees it): a switch on another server of a
    cluster listens on that server's address, not on 127.0.0.1. Every other TCP
    connection to the port is rejected with a reset."""

    def __init__(self, port: int, allowed: str, owner: int | None = None):
        super().__init__(port, owner)
        self.allowed = allowed
        self.table = f"{P4RT_PREFIX}{owner or os.getpid()}_{port}"

    def script(self) -> str:
        t = f"{self.family} {self.table}"
        source = "ip6 saddr" if ":" in self.allowed else "ip saddr"
        rule = f"add rule {t} input tcp dport {self.port}"
        return (f"add table {t}\n"
                f"add chain {t} input {{ type filter hook input priority -10 ; "
                f"policy accept ; }}\n"
                f"{rule} iif lo accept\n"
                f"{rule} {source} {self.allowed} accept\n"
                f"{rule} counter reject with tcp reset\n")
