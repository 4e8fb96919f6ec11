"""The testbed network: Mininet hosts and QAINA switches, programmed over P4Runtime.

``QainaSwitch`` is a Mininet switch whose data plane is ``qaina.p4`` on a target
(embedded or BMv2). ``Testbed`` builds a topology, starts it, connects to every
switch over P4Runtime, installs the pipeline and the routes (shortest paths, one /32
per host and per aggregator address), and programs jobs on the aggregating switch.
With ``host_cpu``, every host is CPU-limited (``harness/cpulimit.py``).
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
from collections import deque
from functools import partial
from pathlib import Path

from mininet.link import TCLink
from mininet.log import lg
from mininet.net import Mininet
from mininet.node import Host, Switch

from ..p4 import program
from ..p4.header import QAINA_WORDS
from .control import SwitchConnection
from .cpulimit import LimitedHost, cgroup_dirs
from .linkloss import apply_loss, remove_table
from .jobs import (Job, Worker, aggregator_ip, aggregator_mac, ip_to_int, mac_to_int,
                   program_aggregator, program_job)
from .record import RunRecord
from .targets import make_target


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (the kernel picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def quiet_interface(ifname: str, run=subprocess.run):
    """No IPv6 chatter and no checksum/segmentation offloads on a testbed interface."""
    run(["sysctl", "-qw", f"net.ipv6.conf.{ifname}.disable_ipv6=1"], capture_output=True)
    run(["ethtool", "-K", ifname, "tx", "off", "rx", "off", "tso", "off", "gso", "off",
         "gro", "off"], capture_output=True)


class QainaSwitch(Switch):
    """A Mininet switch running ``qaina.p4`` on ``target`` ("embedded" or "bmv2")."""

    def __init__(self, name, target="embedded", device_id=1, log_dir=".", record=None,
                 log_packets=False, words=QAINA_WORDS, **params):
        Switch.__init__(self, name, dpid=f"{device_id:x}", **params)
        self.target_kind = target
        self.words = words
        self.log_packets = log_packets
        self.device_id = device_id
        self.log_dir = Path(log_dir)
        self.record = record
        self.target = None

    def start(self, controllers):
        interfaces = {self.ports[intf]: intf.name for intf in self.intfList()
                      if intf.name != "lo"}
        for ifname in interfaces.values():
            quiet_interface(ifname)
        # Fresh ports from the kernel for every run: never a dead run's switch's.
        grpc_port, thrift_port = free_port(), free_port()
        self.target = make_target(self.target_kind, self.name, interfaces, grpc_port,
                                  self.device_id, self.log_dir / f"{self.name}.log",
                                  thrift_port=thrift_port, log_packets=self.log_packets,
                                  words=self.words)
        if self.record is not None:
            self.record.add_port(grpc_port, f"P4Runtime of {self.name}")
            self.record.add_switch(self.name, self.target.grpc_addr, self.device_id,
                                   self.target_kind)
            if self.target_kind == "bmv2":
                self.record.add_port(thrift_port, f"Thrift of {self.name}")
                guard = self.target.guard  # listed before the switch makes it
                self.record.add_nft_table(guard.family, guard.table)
                self.record.save()
        self.target.start()
        if self.record is not None:
            self.record.add_process(self.target.pid, f"switch {self.name}")

    def stop(self, deleteIntfs=True):
        if self.target is not None:
            self.target.stop()
        Switch.stop(self, deleteIntfs)


class MininetLog:
    """Mininet's own messages go to ``path`` while a testbed is up, not to the terminal
    (tc's warnings at high link rates would break a run's progress lines)."""

    def __init__(self, path: Path):
        self.handler = logging.FileHandler(path)
        self.handler.setFormatter(logging.Formatter("%(message)s"))
        self.quieted = [(h, h.level) for h in lg.handlers]
        for h, _ in self.quieted:
            h.setLevel(logging.CRITICAL)
        lg.addHandler(self.handler)

    def close(self):
        lg.removeHandler(self.handler)
        self.handler.close()
        for h, level in self.quieted:
            h.setLevel(level)


class Testbed:
    """A running topology whose switches are programmed over P4Runtime."""

    def __init__(self, topo, target: str, log_dir: Path, record: RunRecord,
                 nft_loss: float | None = None, log_packets: bool = False,
                 words: int = QAINA_WORDS, host_cpu: float | None = None):
        self.topo = topo
        self.host_cpu = host_cpu  # cores of CPU time per second each host may use
        self.words = words  # payload words of the qaina.p4 build every switch runs
        self.log_packets = log_packets
        self.nft_loss = nft_loss  # percent, applied with nftables (kernel without netem)
        self.loss_table = f"qaina_loss_{os.getpid()}"
        self.target = target
        self.log_dir = Path(log_dir)
        self.record = record
        self.net: Mininet | None = None
        self.conns: dict[str, SwitchConnection] = {}
        self.device_ids: dict[str, int] = {}
        self.mininet_log: MininetLog | None = None

    # -- bring-up ----------------------------------------------------------------------
    def start(self, ready_timeout: float = 30.0):
        switch = partial(QainaSwitch, target=self.target, log_dir=self.log_dir,
                         record=self.record, log_packets=self.log_packets, words=self.words)
        self.mininet_log = MininetLog(self.log_dir / "mininet.log")
        host = partial(LimitedHost, cores=self.host_cpu) if self.host_cpu else Host
        self.net = Mininet(topo=self.topo, switch=switch, host=host, link=TCLink,
                           controller=None, build=False, autoSetMacs=False)
        if self.host_cpu:  # listed before they exist: a failed build leaves them too
            for name in self.topo.hosts():
                self.record.add_cgroups([str(d) for d in cgroup_dirs(name)])
            self.record.save()
        self.net.build()  # hosts, switches (each with its device id) and links
        self.device_ids = {sw.name: sw.device_id for sw in self.net.switches}
        for node in self.net.hosts + self.net.switches:
            self.record.add_process(node.pid, f"mininet shell {node.name}")
        for link in self.net.links:  # both ends: one of them is in the root namespace
            self.record.add_interface(link.intf1.name)
            self.record.add_interface(link.intf2.name)
        self.record.save()
        self.net.start()
        for h in self.net.hosts:
            h.cmd("sysctl -qw net.ipv6.conf.all.disable_ipv6=1")
            for intf in h.intfList():
                quiet_interface(intf.name, run=lambda cmd, **kw: h.cmd(" ".join(cmd)))
        if self.nft_loss:
            self.record.add_nft_table("netdev", self.loss_table)
            self.record.save()
            for link in self.net.links:
                for intf in (link.intf1, link.intf2):
                    apply_loss(intf.node, intf.name, self.nft_loss, self.loss_table)
        self.net.staticArp()
        for sw in self.net.switches:
            for h in self.net.hosts:
                h.setARP(aggregator_ip(sw.device_id), aggregator_mac(sw.device_id))
        self._connect(ready_timeout)
        self._install_routes()

    def _connect(self, timeout: float):
        for sw in self.net.switches:
            conn = SwitchConnection(sw.name, sw.target.grpc_addr, sw.device_id,
                                    p4info=program.p4info(self.words),
                                    log_path=self.log_dir / f"p4runtime-{sw.name}.log")
            self.conns[sw.name] = conn
            sw.target.wait_ready(conn, timeout)
            conn.arbitrate()
            conn.set_pipeline(sw.target.device_config())

    # -- routing -----------------------------------------------------------------------
    def _neighbours(self) -> dict[str, list[tuple[str, int]]]:
        """For every node: (neighbour, own port towards it), sorted by port."""
        adj: dict[str, list] = {n.name: [] for n in self.net.hosts + self.net.switches}
        for link in self.net.links:
            a, b = link.intf1, link.intf2
            adj[a.node.name].append((b.node.name, a.node.ports[a]))
            adj[b.node.name].append((a.node.name, b.node.ports[b]))
        return {n: sorted(v, key=lambda x: x[1]) for n, v in adj.items()}

    def next_hops(self, target: str) -> dict[str, int]:
        """For every switch, the egress port of a shortest path to node ``target``."""
        adj = self._neighbours()
        dist = {target: 0}
        queue = deque([target])
        while queue:
            node = queue.popleft()
            for nb, _ in adj[node]:
                if nb not in dist and (nb == target or nb in self.conns):
                    dist[nb] = dist[node] + 1
                    queue.append(nb)
        hops = {}
        for sw in self.conns:
            for nb, port in adj[sw]:
                if dist.get(nb, -2) == dist.get(sw, -1) - 1:
                    hops[sw] = port
                    break
        return hops

    def _install_routes(self):
        routes: dict[str, list] = {sw: [] for sw in self.conns}
        for h in self.net.hosts:
            for sw, port in self.next_hops(h.name).items():
                routes[sw].append(("MyIngress.ipv4_lpm",
                                   {"hdr.ipv4.dstAddr": (ip_to_int(h.IP()), 32)},
                                   "MyIngress.forward", {"port": port}))
        for agg in self.net.switches:
            for sw, port in self.next_hops(agg.name).items():
                routes[sw].append(("MyIngress.ipv4_lpm",
                                   {"hdr.ipv4.dstAddr":
                                    (ip_to_int(aggregator_ip(agg.device_id)), 32)},
                                   "MyIngress.forward", {"port": port}))
        for sw, entries in routes.items():
            self.conns[sw].insert_many(entries)

    # -- jobs --------------------------------------------------------------------------
    def program_jobs(self, aggregator: str, jobs: list[Job]):
        conn = self.conns[aggregator]
        program_aggregator(conn, ip_to_int(aggregator_ip(self.device_ids[aggregator])))
        for job in jobs:
            program_job(conn, job)

    def worker(self, index: int, host: str, aggregator: str) -> Worker:
        h = self.net.get(host)
        return Worker(index, ip_to_int(h.IP()), mac_to_int(h.MAC()),
                      self.next_hops(host)[aggregator], host)

    def switch_program(self) -> dict:
        """What runs the switches (target, and for BMv2 which build)."""
        return self.net.switches[0].target.describe()

    def host(self, name: str):
        return self.net.get(name)

    def switch_interfaces(self) -> list[str]:
        return [intf.name for sw in self.net.switches for intf in sw.intfList()
                if intf.name != "lo"]

    def interface_peers(self) -> dict[str, str]:
        """For every switch interface, the node at the other end of its link."""
        peers = {}
        for link in self.net.links:
            for near, far in ((link.intf1, link.intf2), (link.intf2, link.intf1)):
                if isinstance(near.node, Switch):
                    peers[near.name] = far.node.name
        return peers

    # -- teardown ----------------------------------------------------------------------
    def stop(self):
        """Stop everything; if Mininet cannot (a shell left mid-command), remove what
        the run record lists instead. Raises only if something is still left."""
        for conn in self.conns.values():
            try:
                conn.close()
            except Exception:  # the switch may already be gone
                pass
        self.conns.clear()
        problem = None
        if self.net is not None:
            try:
                self.net.stop()
            except Exception as exc:
                problem = exc or "Mininet teardown failed"
                for sw in self.net.switches:  # our switch processes, by their handles
                    if sw.target is not None:
                        sw.target.stop()
                self.record.remove_resources()
            self.net = None
        if self.nft_loss:
            remove_table(self.loss_table)
        if self.mininet_log is not None:
            self.mininet_log.close()
            self.mininet_log = None
        left = self.record.leftovers()
        if left:
            raise RuntimeError(f"teardown left {', '.join(left)}"
                               + (f" ({problem!r})" if problem else ""))
