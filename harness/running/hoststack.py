"""A testbed node's network stack, set once it runs: IPv6 and offloads off on its
interfaces, and on a host the TCP congestion control its TCP
baselines use (``--tcp-cc``), the same on every machine whatever its default."""

from __future__ import annotations

import subprocess

from .mininetlog import LinkError


def quiet_interface(ifname: str, run=subprocess.run):
    """No IPv6 chatter and no checksum/segmentation offloads on a testbed interface."""
    run(["sysctl", "-qw", f"net.ipv6.conf.{ifname}.disable_ipv6=1"], capture_output=True)
    run(["ethtool", "-K", ifname, "tx", "off", "rx", "off", "tso", "off", "gso", "off",
         "gro", "off"], capture_output=True)


def configure_host(host, tcp_cc: str):
    """IPv6 off on ``host`` and its interfaces; its TCP congestion control ``tcp_cc``
    (``system``: the kernel's default); LinkError, naming the host, if refused."""
    host.cmd("sysctl -qw net.ipv6.conf.all.disable_ipv6=1")
    for intf in host.intfList():
        quiet_interface(intf.name, run=lambda cmd, **kw: host.cmd(" ".join(cmd)))
    if tcp_cc == "system":
        return
    said = host.cmd(f"sysctl -qw net.ipv4.tcp_congestion_control={tcp_cc} 2>&1").strip()
    if said:
        raise LinkError(f"--tcp-cc {tcp_cc}: {host.name} refused it ({said.splitlines()[-1]})"
                        f"; see /proc/sys/net/ipv4/tcp_available_congestion_control")
