"""Random link loss: netem where the kernel has it, nftables where it does not.

Mininet's TCLink shapes bandwidth with HTB and adds delay and loss with netem. Some
kernels are built without netem (CONFIG_NET_SCH_NETEM); there, loss is applied by an
nftables rule on the egress hook of both interfaces of every link
(``numgen random mod 10000 < p*100 drop``), which drops the same share of frames in
each direction before they reach the wire, for hosts' sockets and the switches' raw
sockets alike. Delay has no such replacement: without netem, ``--delay`` is refused.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import tempfile

PROBE_IF = "qnetemprobe0"


@functools.lru_cache(maxsize=None)
def netem_available() -> bool:
    """Whether ``tc`` can attach a netem qdisc here (probed on a throw-away veth)."""
    if shutil.which("tc") is None or shutil.which("ip") is None or os.geteuid() != 0:
        return False
    peer = PROBE_IF[:-1] + "1"
    made = subprocess.run(["ip", "link", "add", PROBE_IF, "type", "veth", "peer", "name",
                           peer], capture_output=True).returncode == 0
    if not made:
        return False
    try:
        res = subprocess.run(["tc", "qdisc", "add", "dev", PROBE_IF, "root", "netem",
                              "loss", "1%"], capture_output=True)
        return res.returncode == 0
    finally:
        subprocess.run(["ip", "link", "del", PROBE_IF], capture_output=True)


def nft_available() -> bool:
    return shutil.which("nft") is not None


def loss_rules(table: str, ifname: str, percent: float) -> list[str]:
    """nft commands that drop ``percent`` % of the frames ``ifname`` transmits."""
    threshold = round(percent * 100)
    chain = f"egress_{ifname}".replace("-", "_")
    return [
        f"add table netdev {table}",
        f"add chain netdev {table} {chain} {{ type filter hook egress device \"{ifname}\" "
        f"priority 0 ; policy accept ; }}",
        f"add rule netdev {table} {chain} numgen random mod 10000 lt {threshold} drop",
    ]


def apply_loss(node, ifname: str, percent: float, table: str):
    """Add the loss rules for ``ifname`` in ``node``'s network namespace."""
    script = "\n".join(loss_rules(table, ifname, percent)) + "\n"
    if node.inNamespace:
        with tempfile.NamedTemporaryFile("w", suffix=".nft", prefix="qaina-loss-") as f:
            f.write(script)
            f.flush()
            out = node.cmd(f"nft -f {f.name} && echo nft-ok")
        if "nft-ok" not in out:
            raise OSError(f"nft on {node.name}/{ifname}: {out.strip()}")
    else:
        res = subprocess.run(["nft", "-f", "-"], input=script, text=True, capture_output=True)
        if res.returncode != 0:
            raise OSError(f"nft on {ifname}: {res.stderr.strip()}")


def remove_table(table: str):
    """Delete a root-namespace loss table (hosts' tables go with their namespaces)."""
    subprocess.run(["nft", "delete", "table", "netdev", table], capture_output=True)
