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

The rules act on what the egress hook sees, before the kernel cuts a TCP burst (GSO,
up to ~45 segments on the testbed's links) into frames, as a netem qdisc does: a host's
TCP loses a burst at a time, the share of bytes lost still ``percent``. Datagrams (the
agents' packets) and what a switch forwards are lost frame by frame. Cutting every
burst to one segment (``gso_max_segs 1``) would make TCP losses independent, but
would change what the TCP baselines cost per byte against the runs they are
compared with, so the links keep the kernel's bursts. ``link_losses`` reads what the
rules saw and lost, the summary's ``link_loss``.
"""

from __future__ import annotations

import base64
import functools
import json
import os
import shutil
import subprocess

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


def loss_chain(ifname: str) -> str:
    """The name of the chain that loses ``ifname``'s frames."""
    return f"egress_{ifname}".replace("-", "_")


def loss_rules(table: str, ifname: str, percent: float) -> list[str]:
    """nft commands that lose ``percent`` % of the frames ``ifname`` transmits (their
    EtherType spoiled, so the receiver discards them). A first rule counts every frame
    the hook sees, the second the frames it loses (``loss_counts`` reads both)."""
    threshold = round(percent * 100)
    chain = loss_chain(ifname)
    return [
        f"add table netdev {table}",
        f"add chain netdev {table} {chain} {{ type filter hook egress device \"{ifname}\" "
        f"priority 0 ; policy accept ; }}",
        f"add rule netdev {table} {chain} counter",
        f"add rule netdev {table} {chain} numgen random mod 10000 lt {threshold} counter "
        f"ether type set {LOST_ETHERTYPE:#06x}",
    ]


NO_COUNTS = {"frames": 0, "bytes": 0, "lost": 0, "lost_bytes": 0}


def parse_counts(listing: str) -> dict[str, dict[str, int]]:
    """``{chain: {"frames", "bytes", "lost", "lost_bytes"}}`` from ``nft -j list table``
    of a loss table: the chain's plain counter (what the hook saw) and its losing rule's
    counter. A "frame" is what the hook sees: a host's TCP hands it segments in bursts
    (GSO) that are cut into frames after the hook, so one of them is lost as a whole."""
    out: dict[str, dict[str, int]] = {}
    for item in json.loads(listing).get("nftables", []):
        rule = item.get("rule")
        if not rule:
            continue
        exprs = rule.get("expr") or []
        count = next((e["counter"] for e in exprs if "counter" in e), {})
        lost = any("match" in e for e in exprs)
        mine = out.setdefault(rule["chain"], dict(NO_COUNTS))
        mine["lost" if lost else "frames"] = int(count.get("packets", 0))
        mine["lost_bytes" if lost else "bytes"] = int(count.get("bytes", 0))
    return out


def loss_counts(nodes, table: str) -> tuple[dict[str, dict[str, int]], list[str]]:
    """What the loss rules of every interface of ``nodes`` (Mininet nodes) saw and lost
    (``parse_counts`` per chain), read from each network namespace once, and why the
    namespaces that could not be read were not."""
    out: dict[str, dict[str, int]] = {}
    problems, places = [], set()
    for node in nodes:
        place = (getattr(node, "server", None), node.name if node.inNamespace else None)
        if place in places:
            continue
        places.add(place)
        try:
            listing = _listing(node, table)
        except OSError as exc:
            problems.append(str(exc))
            continue
        try:
            out.update(parse_counts(listing))
        except (ValueError, KeyError, TypeError, AttributeError):
            problems.append(f"{node.name}: {listing.strip()[:200]}")
    return out, problems


def _listing(node, table: str, timeout: float = 10.0) -> str:
    """``nft -j list table netdev TABLE`` in ``node``'s network namespace, on its
    server; not through its shell, which may be busy (a user's command) or stopped."""
    cmd = ["nft", "-j", "list", "table", "netdev", table]
    if node.inNamespace or getattr(node, "isRemote", False):
        cmd = ["mnexec", "-a", str(node.pid)] + cmd
    if getattr(node, "isRemote", False):
        popen = node.rpopen(cmd, short=True)  # one list: rpopen passes on its words
    else:
        popen = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        out, _ = popen.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        popen.kill()
        popen.communicate()
        raise OSError(f"{node.name}: nft did not answer in {timeout:g} s") from None
    text = out.decode(errors="replace") if isinstance(out, bytes) else (out or "")
    if popen.returncode != 0:
        raise OSError(f"{node.name}: {text.strip()[-200:] or f'exit {popen.returncode}'}")
    return text


def apply_loss(node, ifname: str, percent: float, table: str):
    """Add the loss rules for ``ifname`` in ``node``'s network namespace."""
    script = "\n".join(loss_rules(table, ifname, percent)) + "\n"
    if getattr(node, "isRemote", False) or node.inNamespace:
        # through its shell, on one line: no temporary file, which a kill -9 would leave
        encoded = base64.b64encode(script.encode()).decode()
        out = node.cmd(f"echo {encoded} | base64 -d | nft -f - && echo nft-ok")
        if "nft-ok" not in out:
            where = f"{node.server} " if getattr(node, "isRemote", False) else ""
            raise OSError(f"nft on {where}{node.name}/{ifname}: {out.strip()}")
    else:
        res = subprocess.run(["nft", "-f", "-"], input=script, text=True, capture_output=True)
        if res.returncode != 0:
            raise OSError(f"nft on {ifname}: {res.stderr.strip()}")


def remove_table(table: str):
    """Delete a root-namespace loss table (hosts' tables go with their namespaces)."""
    subprocess.run(["nft", "delete", "table", "netdev", table], capture_output=True)


def link_losses(net, table: str) -> dict:
    """Per interface of ``net``'s links, the frames its loss rule saw and lost, as the
    summary's ``link_loss`` takes them (``{"interfaces": ...}``, and ``"error"`` when a
    namespace's table could not be read: its interfaces are then left out)."""
    intfs = [i for link in net.links for i in (link.intf1, link.intf2)]
    try:
        counts, problems = loss_counts({i.node.name: i.node for i in intfs}.values(), table)
    except Exception as exc:  # noqa: BLE001 - teardown goes on without the counts
        counts, problems = {}, [f"{type(exc).__name__}: {exc}"]
    out = {"interfaces": {i.name: counts[loss_chain(i.name)]
                          for i in sorted(intfs, key=lambda i: i.name)
                          if loss_chain(i.name) in counts}}
    if problems:
        out["error"] = f"the loss rules' counters of some links could not be read: " \
                       f"{'; '.join(problems[:3])}"
    return out
