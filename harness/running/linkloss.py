"""Random link loss: netem where the kernel has it, nftables where it does not.

Mininet's TCLink shapes bandwidth with HTB and adds delay and loss with netem. Some
kernels are built without netem (CONFIG_NET_SCH_NETEM); there, loss is applied by an
nftables rule on the egress hook of both interfaces of every link, which spoils the
same share of frames in each direction: ``numgen random mod 10000 < p*100`` sets their
EtherType to ``LOST_ETHERTYPE`` (IEEE's local experimental 0x88B5), so the receiver
discards them, a host's kernel for want of a protocol, a switch's parser as
``not_ipv4`` (counted there). The frame is lost on the wire, as with netem. Dropping
it in the hook instead would not be a loss for TCP: Linux TCP sees the local drop and
sends the segment again at once, never counting a retransmission, so the ring and
parameter-server baselines would run as if the links were lossless (measured: 0
retransmissions with a 10% drop rule, 183 with this one, on 3 MB). Delay has no such
replacement: without netem, ``--delay`` is refused.
"""

from __future__ import annotations

import base64
import functools
import os
import shutil
import subprocess
import tempfile

LOST_ETHERTYPE = 0x88B5  # a frame lost on a link: no receiver takes it
#: the probe of ``netem_available``: a veth pair with a netem qdisc, made in a network
#: namespace of its own that ends with the probe (nothing is left if it is killed, and
#: probes of two runs at once do not meet)
NETEM_PROBE = ("ip link add qprobe0 type veth peer name qprobe1 && "
               "tc qdisc add dev qprobe0 root netem loss 1%")


@functools.lru_cache(maxsize=None)
def netem_available() -> bool:
    """Whether ``tc`` can attach a netem qdisc here (probed on a throw-away veth in a
    throw-away network namespace)."""
    if any(shutil.which(tool) is None for tool in ("tc", "ip", "unshare")) \
            or os.geteuid() != 0:
        return False
    return subprocess.run(["unshare", "--net", "sh", "-c", NETEM_PROBE],
                          capture_output=True).returncode == 0


def nft_available() -> bool:
    return shutil.which("nft") is not None


def loss_rules(table: str, ifname: str, percent: float) -> list[str]:
    """nft commands that lose ``percent`` % of the frames ``ifname`` transmits (their
    EtherType spoiled, so the receiver discards them)."""
    threshold = round(percent * 100)
    chain = f"egress_{ifname}".replace("-", "_")
    return [
        f"add table netdev {table}",
        f"add chain netdev {table} {chain} {{ type filter hook egress device \"{ifname}\" "
        f"priority 0 ; policy accept ; }}",
        f"add rule netdev {table} {chain} numgen random mod 10000 lt {threshold} counter "
        f"ether type set {LOST_ETHERTYPE:#06x}",
    ]


def apply_loss(node, ifname: str, percent: float, table: str):
    """Add the loss rules for ``ifname`` in ``node``'s network namespace."""
    script = "\n".join(loss_rules(table, ifname, percent)) + "\n"
    if getattr(node, "isRemote", False):  # its shell runs on another server: the rules
        # go through it on one line (no temporary file there, no here-document)
        encoded = base64.b64encode(script.encode()).decode()
        out = node.cmd(f"echo {encoded} | base64 -d | nft -f - && echo nft-ok")
        if "nft-ok" not in out:
            raise OSError(f"nft on {node.server} {node.name}/{ifname}: {out.strip()}")
    elif node.inNamespace:
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
