"""A testbed node's network stack, set once it runs: IPv6 and offloads off on its
interfaces, and where a run asks, the host's default TCP congestion control. (The TCP
baselines set ``--tcp-cc`` on their own sockets, ``hosts/ring.py``; the default is for
what the project does not open, a ``--train-script``'s TCP.)"""

from __future__ import annotations

import subprocess


def quiet_interface(ifname: str, run=subprocess.run):
    """No IPv6 chatter and no checksum/segmentation offloads on a testbed interface."""
    run(["sysctl", "-qw", f"net.ipv6.conf.{ifname}.disable_ipv6=1"], capture_output=True)
    run(["ethtool", "-K", ifname, "tx", "off", "rx", "off", "tso", "off", "gso", "off",
         "gro", "off"], capture_output=True)


def configure_host(host, tcp_cc: str | None = None) -> str | None:
    """IPv6 off on ``host`` and its interfaces; its default TCP congestion control
    ``tcp_cc`` (None: left as it is). Returns why the kernel refused ``tcp_cc``, if it
    did: a network namespace may only default to one of
    ``net.ipv4.tcp_allowed_congestion_control``."""
    host.cmd("sysctl -qw net.ipv6.conf.all.disable_ipv6=1")
    for intf in host.intfList():
        quiet_interface(intf.name, run=lambda cmd, **kw: host.cmd(" ".join(cmd)))
    if tcp_cc is None:
        return None
    said = host.cmd(f"sysctl -qw net.ipv4.tcp_congestion_control={tcp_cc} 2>&1").strip()
    if not said:
        return None
    kept = host.cmd("sysctl -n net.ipv4.tcp_congestion_control").strip()
    return (f"--tcp-cc {tcp_cc}: {host.name}'s default TCP congestion control stays {kept} "
            f"({said.splitlines()[-1]}; a network namespace may only default to one of "
            "net.ipv4.tcp_allowed_congestion_control), so the training script's TCP runs "
            f"on {kept}")
