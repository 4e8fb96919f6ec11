"""Link loss without netem: a frame the rule loses is lost on the wire, also for TCP."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from qaina_bench.harness.running.hoststack import quiet_interface
from qaina_bench.harness.running.linkloss import loss_chain, loss_rules, parse_counts

pytestmark = [pytest.mark.root, pytest.mark.skipif(
    shutil.which("nft") is None or shutil.which("ip") is None,
    reason="needs ip and nft (apt-get install iproute2 nftables)")]

RECEIVER = """
import socket
l = socket.socket(); l.bind(("10.199.0.2", 5001)); l.listen(1); c, _ = l.accept()
n = 0
while True:
    d = c.recv(65536)
    if not d:
        break
    n += len(d)
print(n)
"""
SENDER = """
import socket, struct, time
c = socket.create_connection(("10.199.0.2", 5001), timeout=20)
c.sendall(b"x" * 20_000_000)
time.sleep(0.5)
info = c.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
print(struct.unpack_from("I", info, 100)[0])
c.close()
"""


def sh(*cmd, **kw):
    return subprocess.run(list(cmd), check=True, capture_output=True, text=True, **kw)


def test_tcp_retransmits_what_the_rule_loses():
    tag = f"ql{os.getpid() % 100000}"
    a, b = f"{tag}a", f"{tag}b"
    try:
        sh("ip", "netns", "add", a)
        sh("ip", "netns", "add", b)
        sh("ip", "link", "add", f"{tag}x", "type", "veth", "peer", "name", f"{tag}y")
        sh("ip", "link", "set", f"{tag}x", "netns", a)
        sh("ip", "link", "set", f"{tag}y", "netns", b)
        for ns, dev, ip in ((a, f"{tag}x", "10.199.0.1/24"), (b, f"{tag}y", "10.199.0.2/24")):
            sh("ip", "-n", ns, "addr", "add", ip, "dev", dev)
            sh("ip", "-n", ns, "link", "set", dev, "up")
            quiet_interface(dev, run=lambda cmd, ns=ns, **kw: sh("ip", "netns", "exec",
                                                                 ns, *cmd))  # as a run's
        rules = "\n".join(loss_rules("qloss", f"{tag}x", 10.0)) + "\n"
        sh("ip", "netns", "exec", a, "nft", "-f", "-", input=rules)
        receiver = subprocess.Popen(["ip", "netns", "exec", b, sys.executable, "-c", RECEIVER],
                                    stdout=subprocess.PIPE, text=True)
        for _ in range(50):  # until it listens
            if "5001" in sh("ip", "netns", "exec", b, "ss", "-ltn").stdout:
                break
            subprocess.run(["sleep", "0.05"])
        retransmitted = int(sh("ip", "netns", "exec", a, sys.executable, "-c", SENDER,
                               timeout=60).stdout)
        received = int(receiver.communicate(timeout=30)[0])
        assert received == 20_000_000
        listing = sh("ip", "netns", "exec", a, "nft", "list", "table", "netdev", "qloss").stdout
        assert "ether type set 0x88b5" in listing
        counts = parse_counts(sh("ip", "netns", "exec", a, "nft", "-j", "list", "table",
                                 "netdev", "qloss").stdout)[loss_chain(f"{tag}x")]
        # every byte passed the hook, in TCP's bursts (GSO: cut into frames after it, so
        # a few hundred of them), and about 10% of the bytes were lost with their bursts
        assert counts["bytes"] >= 20_000_000 and counts["frames"] >= 100, listing
        assert 0.04 < counts["lost_bytes"] / counts["bytes"] < 0.16, listing
        # A drop in the sender's own hook is resent at once and never counted (0 here).
        assert retransmitted > 0, listing
    finally:
        for ns in (a, b):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def test_the_netem_probe_leaves_nothing_and_probes_at_once_agree():
    """Four probes at once (runs starting together) get the same answer as a probe
    alone, through veth pairs of their own that nothing outside them sees."""
    from concurrent.futures import ThreadPoolExecutor

    from qaina_bench.harness.running.linkloss import netem_available
    probe = netem_available.__wrapped__  # not the cached answer
    tc = subprocess.run(["sh", "-c", "ip link add qtest0 type veth peer name qtest1 && "
                         "tc qdisc add dev qtest0 root netem loss 1%"], capture_output=True)
    subprocess.run(["ip", "link", "del", "qtest0"], capture_output=True)
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda _: probe(), range(4)))
    assert answers == [tc.returncode == 0] * 4
    links = subprocess.run(["ip", "-br", "link"], capture_output=True, text=True).stdout
    assert "qprobe" not in links
