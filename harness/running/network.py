"""The testbed network: Mininet hosts and QAINA switches, programmed over P4Runtime.

``QainaSwitch`` is a Mininet switch whose data plane is ``qaina.p4`` on a target
(embedded or BMv2). ``Testbed`` builds a topology, starts it, connects to every
switch over P4Runtime, installs the pipeline and the routes (shortest paths, one /32
per host and per aggregator address) and the source address validation of every
port, and programs jobs on the aggregating switch.
With ``host_cpu``, every host is CPU-limited (``harness/running/cpulimit.py``).
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections import deque
from dataclasses import replace
from functools import partial
from pathlib import Path

from mininet.link import TCLink
from mininet.net import Mininet
from mininet.node import Host, Switch

from ...p4 import program
from ...p4.header import FALLBACK_WORKER, QAINA_WORDS
from ..switches.control import SwitchConnection
from .clusternet import ClusterParts
from .cpulimit import LimitedHost, cgroup_dirs, process_cgroups
from .hoststack import configure_host, quiet_interface
from .linkloss import apply_loss, link_losses, remove_table
from .linknames import planned_interfaces
from .mininetlog import LinkError, MininetLog
from ..switches.jobs import (Job, Upstream, Worker, aggregator_ip, aggregator_mac, free_copies,
                   guard_entries, ip_to_int, mac_to_int, program_aggregator, program_job,
                   release_job, result_entry, source_entry)
from .record import RunRecord
from .shells import bound_shell_commands
from ..switches.targets import TargetError, make_target


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (the kernel picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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

    def stop_soon(self):
        """Ask the switch to stop (SIGTERM) without waiting: ``stop`` then waits for
        it (a testbed's switches wind down at once, not one after another)."""
        if self.target is not None:
            self.target.terminate()


#: characters of ``arp -s`` commands per shell line (well inside a terminal's 4 KiB)
ARP_LINE = 1500


class Testbed(ClusterParts):
    """A running topology whose switches are programmed over P4Runtime."""

    def __init__(self, topo, target: str, log_dir: Path, record: RunRecord,
                 nft_loss: float | None = None, log_packets: bool = False,
                 words: int = QAINA_WORDS, host_cpu: float | None = None, cluster=None,
                 host_tcp_cc: str | None = None):
        self.topo = topo
        self.host_tcp_cc = host_tcp_cc  # the hosts' default TCP congestion control
        self.stack_refusals: list[str] = []  # what the hosts' kernels refused of it
        self.cluster = cluster  # the servers (harness/running/cluster.py), None: this one
        self.host_cpu = host_cpu  # cores of CPU time per second each host may use
        self.words = words  # payload words of the qaina.p4 build every switch runs
        self.log_packets = log_packets
        self.nft_loss = nft_loss  # percent, applied with nftables (kernel without netem)
        self.loss_table = f"qaina_loss_{os.getpid()}"
        self.link_loss: dict | None = None  # what the rules lost (``link_losses``)
        self.target = target
        self.log_dir = Path(log_dir)
        self.record = record
        self.net: Mininet | None = None
        self.conns: dict[str, SwitchConnection] = {}
        self.device_ids: dict[str, int] = {}
        self._hops: dict[str, dict[str, int]] = {}
        #: source_guard entries installed: (switch, port, address) -> results (0 or 1)
        self._admitted: dict[tuple[str, int, int], int] = {}
        self._fallbacks: dict[int, str] = {}  # fallback host address -> host
        self._freeing: list[threading.Thread] = []  # copies of shared jobs being freed
        self.free_errors: list[str] = []
        self.mininet_log: MininetLog | None = None
        self.remote_procs: list[tuple] = []  # (node, PID) started on other servers
        self.remote_pids: dict[int, tuple] = {}  # their ssh session's PID -> (server, PID)
        self._starting: list[tuple] = []  # (node, ssh session, what): PID not read yet

    # -- bring-up ----------------------------------------------------------------------
    def start(self, ready_timeout: float = 30.0):
        switch = partial(QainaSwitch, target=self.target, log_dir=self.log_dir,
                         record=self.record, log_packets=self.log_packets, words=self.words)
        self.mininet_log = MininetLog(self.log_dir / "mininet.log")
        host = partial(LimitedHost, cores=self.host_cpu) if self.host_cpu else Host
        if self.cluster is not None:
            self.net = self._cluster_net()
        else:
            self.net = Mininet(topo=self.topo, switch=switch, host=host, link=TCLink,
                               controller=None, build=False, autoSetMacs=False)
        if self.host_cpu:  # listed before they exist: a failed build leaves them too
            for name in self.topo.hosts():
                self.record.add_cgroups([str(d) for d in cgroup_dirs(name)])
        if self.cluster is None:  # and the links' ends: a build cut short by a kill -9
            for name in planned_interfaces(self.topo):  # leaves them here (clean)
                self.record.add_interface(name)
        self.record.save()
        try:
            self.net.build()  # hosts, switches (each with its device id) and links
        except Exception as exc:
            from .cluster import ClusterError
            if self.cluster is None or isinstance(exc, ClusterError):
                raise
            why = (str(exc).strip().splitlines() or [repr(exc)])[-1]
            raise ClusterError(f"building the network on {', '.join(self.cluster.names())} "
                               f"failed: {why}") from exc
        self.device_ids = {sw.name: sw.device_id for sw in self.net.switches}
        self._record_nodes()
        failed = self.mininet_log.tc_failures()
        if failed:  # Mininet logs it and leaves the link unshaped: the run would mislead
            raise LinkError(f"shaping the links failed: tc said {failed[0]!r} "
                            f"({len(failed)} refused command(s); {self.log_dir}/mininet.log)")
        if self.cluster is not None:  # where every node ran, next to the logs
            (self.log_dir / "placement.json").write_text(json.dumps(self.placement(), indent=1))
        self.net.start()
        refused = [configure_host(h, self.host_tcp_cc) for h in self.net.hosts]
        self.stack_refusals = [r for r in refused if r][:1]
        if self.nft_loss:
            self.record.add_nft_table("netdev", self.loss_table)
            for server in self._loss_servers():
                self.record.add_remote_nft_table(server.name, server.user, "netdev",
                                                 self.loss_table)
            self.record.save()
            for link in self.net.links:
                for intf in (link.intf1, link.intf2):
                    apply_loss(intf.node, intf.name, self.nft_loss, self.loss_table)
        self._static_arp()
        self._connect(ready_timeout)
        self._install_routes()
        self._install_source_guards()

    def _static_arp(self):
        """Every host knows every other host's and every aggregator's MAC (Mininet's
        ``staticArp``, and the switches' addresses): a few shell lines per host, not
        one per entry (n² lines, seconds at 32 hosts)."""
        entries = [(h.IP(), h.MAC()) for h in self.net.hosts] + [
            (aggregator_ip(sw.device_id), aggregator_mac(sw.device_id))
            for sw in self.net.switches]
        for h in self.net.hosts:
            line = ""
            for ip, mac in entries:
                if ip == h.IP():
                    continue
                line += f"arp -s {ip} {mac}; "
                if len(line) > ARP_LINE:
                    h.cmd(line)
                    line = ""
            if line:
                h.cmd(line)

    def _record_nodes(self):
        """Every node's shell and both ends of every link, on the server each is on
        (an ssh session's end here); the ssh tunnels of links between servers."""
        for node in self.net.hosts + self.net.switches:
            server = getattr(node, "server_key", None)
            if server is None:
                self.record.add_process(node.pid, f"mininet shell {node.name}")
            else:
                self.record.add_process(node.shell.pid, f"ssh to {node.name} on {server}")
                self.record.add_remote_process(server, node.user, node.pid, None,
                                               f"mininet shell {node.name}")
        for link in self.net.links:  # both ends: one of them is in the root namespace
            for intf in (link.intf1, link.intf2):
                server = getattr(intf.node, "server_key", None)
                if server is None:
                    self.record.add_interface(intf.name)
                else:
                    self.record.add_remote_interface(server, intf.node.user, intf.name)
            tunnel = getattr(link, "tunnel", None)
            if tunnel is not None:
                self.record.add_process(tunnel.pid, f"ssh tunnel {link.intf1.name}-"
                                        f"{link.intf2.name}")
        self.record.save()

    def placement(self) -> dict[str, str]:
        """Node -> the server it runs on ("localhost": this machine)."""
        return {n.name: getattr(n, "server", "localhost") or "localhost"
                for n in self.net.hosts + self.net.switches}

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

    def hops(self, target: str) -> dict[str, int]:
        """``next_hops(target)``, computed once: the routes the switches hold."""
        if target not in self._hops:
            self._hops[target] = self.next_hops(target)
        return self._hops[target]

    def _links(self) -> dict[tuple[str, int], tuple[str, int]]:
        """(node, port) -> (node, port) at the other end of the link."""
        ends = {}
        for link in self.net.links:
            a, b = link.intf1, link.intf2
            ends[(a.node.name, a.node.ports[a])] = (b.node.name, b.node.ports[b])
            ends[(b.node.name, b.node.ports[b])] = (a.node.name, a.node.ports[a])
        return ends

    def arrivals(self, node: str, port: int, target: str, links=None) -> list[tuple[str, int]]:
        """Where a packet for node ``target`` that leaves node ``node`` through its port
        ``port`` enters switches on the installed routes: (switch, ingress port), in
        the order it crosses them."""
        links = links or self._links()
        hops = self.hops(target)
        out = []
        while len(out) <= len(self.conns):
            node, port = links[(node, port)]
            if node not in self.conns:  # a host: delivered
                break
            out.append((node, port))
            port = hops.get(node)
            if port is None:  # no route on: the target switch, or no_route
                break
        return out

    def host_sources(self) -> dict[str, dict[int, set[int]]]:
        """For every switch and port, the host addresses whose packets arrive there on
        the installed routes (to any host or aggregator address). A port facing a
        host gets that host's address; a port between switches the addresses of the
        hosts whose traffic the routes lead through it."""
        links, adj = self._links(), self._neighbours()
        targets = [h.name for h in self.net.hosts] + list(self.conns)
        sources: dict[str, dict[int, set[int]]] = {sw: {} for sw in self.conns}
        for h in self.net.hosts:
            address = ip_to_int(h.IP())
            for _, port in adj[h.name]:
                for target in targets:
                    if target == h.name:
                        continue
                    for sw, in_port in self.arrivals(h.name, port, target, links):
                        sources[sw].setdefault(in_port, set()).add(address)
        return sources

    def _install_source_guards(self):
        """Every port of every switch is guarded: it admits the sources of
        ``host_sources`` only (an aggregator's results are admitted by ``install_job``)."""
        sources, adj = self.host_sources(), self._neighbours()
        for sw, conn in self.conns.items():
            entries = []
            for _, port in adj[sw]:
                admitted = sources[sw].get(port, ())
                entries += guard_entries(port, admitted)
                self._admitted.update({(sw, port, a): 0 for a in admitted})
            conn.insert_many(entries)

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
    def program_aggregators(self, switches):
        """The switches answer for their aggregator addresses."""
        for sw in switches:
            program_aggregator(self.conns[sw], ip_to_int(aggregator_ip(self.device_ids[sw])))

    def install_job(self, placements: dict[str, Job]):
        """Install a job on every switch of its ``placements``, the lower ones first,
        and admit what its aggregators send: results on their way down, sums on their
        way up."""
        for sw, job in placements.items():
            program_job(self.conns[sw], job)
            address = ip_to_int(aggregator_ip(self.device_ids[sw]))
            self._allow_results(sw, address, [job])
            if job.shared:  # sums and singles go to its fallback host, results come back
                host = self._fallbacks[job.upstream.ip]
                self._admit(sw, address, job.upstream.port, host, entry=source_entry)
                self._admit(host, job.upstream.ip, self._neighbours()[host][0][1], sw)
            elif job.upstream is not None:
                top = next(s for s, j in placements.items() if j.upstream is None)
                self._admit(sw, address, job.upstream.port, top, entry=source_entry)

    def remove_job(self, placements: dict[str, Job]):
        """Delete a job's entries; a shared job's copies are freed meanwhile in the
        background (through BMv2's Thrift CLI that takes a second, and a job that
        arrives must not wait for it)."""
        for sw, job in placements.items():
            registers = self.net.get(sw).target.registers(self.conns[sw])
            release_job(self.conns[sw], job, free=False)
            if job.shared:
                t = threading.Thread(target=self._free_copies, args=(registers, job.job_id),
                                     name=f"free-{sw}-{job.job_id}", daemon=True)
                t.start()
                self._freeing.append(t)

    def _free_copies(self, registers, job_id: int):
        try:
            free_copies(registers, job_id)
        except Exception as exc:  # the switch went away meanwhile: nothing to free
            self.free_errors.append(f"freeing job {job_id}'s copies: {exc}")

    def placements(self, job: Job, top: str, levels: int = 1) -> dict[str, Job]:
        """The job as each switch that aggregates it holds it, ``top`` (``job``'s
        switch, whose ports its workers carry) last. With two levels every worker not
        attached to ``top`` is aggregated first by the switch it is attached to, which
        sends one sum per chunk up to ``top`` as a worker of ``top``'s job."""
        if levels == 1:
            return {top: job}
        below: dict[str, list[Worker]] = {}
        for w in job.workers:
            below.setdefault(self.attached(w.host), []).append(w)
        direct = below.pop(top, [])
        members = [Worker(k, w.ip, w.mac, w.port, w.host) for k, w in enumerate(direct)]
        out = {}
        top_id = self.device_ids[top]
        to_top = self.hops(top)
        for sw, workers in sorted(below.items()):
            index = len(members)
            dev = self.device_ids[sw]
            members.append(Worker(index, ip_to_int(aggregator_ip(dev)),
                                  mac_to_int(aggregator_mac(dev)), self.hops(sw)[top], sw))
            hops = {w.host: self.hops(w.host)[sw] for w in workers}
            out[sw] = replace(job, workers=[Worker(k, w.ip, w.mac, hops[w.host], w.host)
                                            for k, w in enumerate(workers)],
                              upstream=Upstream(to_top[sw], ip_to_int(aggregator_ip(top_id)),
                                                mac_to_int(aggregator_mac(top_id)), index))
        out[top] = replace(job, workers=members)
        return out

    def fallback(self, host: str, aggregator: str) -> Upstream:
        """--allocation shared: the ``upstream_table`` entry that makes ``host`` the
        fallback host of a job aggregated on switch ``aggregator``."""
        h = self.net.get(host)
        self._fallbacks[ip_to_int(h.IP())] = host
        return Upstream(self.hops(host)[aggregator], ip_to_int(h.IP()), mac_to_int(h.MAC()),
                        FALLBACK_WORKER)

    def attached(self, host: str) -> str:
        """The switch ``host`` is linked to."""
        return next(nb for nb, _ in self._neighbours()[host] if nb in self.conns)

    def _allow_results(self, aggregator: str, address: int, jobs: list[Job]):
        """Every switch port that the aggregator's results (multicast and answers to
        retransmissions, both leave through the worker's port) enter on their way to a
        worker admits results from the aggregator's address."""
        for job in jobs:
            for w in job.workers:
                self._admit(aggregator, address, w.port, w.host)

    def _admit(self, sender: str, address: int, port: int, target: str, entry=result_entry):
        """Every switch port a packet from ``sender`` (at ``address``) leaving through
        its ``port`` for node ``target`` enters admits it (``entry``: as results, or
        as a source only); a port that admits the source but not its results is
        changed to admit them too when ``entry`` is ``result_entry``."""
        results = int(entry is result_entry)
        keys = sorted({(sw, in_port, address)
                       for sw, in_port in self.arrivals(sender, port, target)})
        new = [k for k in keys if k not in self._admitted]
        raise_ = [k for k in keys if self._admitted.get(k, results) < results]
        for sw, conn in self.conns.items():
            conn.insert_many([entry(p, a) for s, p, a in new if s == sw])
            conn.modify_many([entry(p, a) for s, p, a in raise_ if s == sw])
        self._admitted.update({k: max(results, self._admitted.get(k, 0)) for k in keys})

    def worker(self, index: int, host: str, aggregator: str) -> Worker:
        h = self.net.get(host)
        return Worker(index, ip_to_int(h.IP()), mac_to_int(h.MAC()),
                      self.next_hops(host)[aggregator], host)

    def start_process(self, host: str, cmd: list[str], out, log: Path, env: dict,
                      what: str, wait: bool = True, starter=None):
        """Start ``cmd`` on Mininet host ``host`` (its output to ``out``, the open
        ``log``) and record it; on another server of a cluster through ``remote
        launch``, recorded there by its PID (``wait``: now; else by ``started``, so
        that several start at once) and stopped by ``stop``. An agent is forked by the
        starter of its server where ``starter`` (``harness/running/starter.py``) has
        one (into the host's cgroups with ``host_cpu``, as ``mnexec -g`` puts others)."""
        node = self.net.get(host)
        server = getattr(node, "server_key", None)
        args = starter.arguments(cmd) if starter is not None else None
        cgroups = process_cgroups(host) if self.host_cpu else []
        if args is not None and server is None and starter.local is not None:
            popen = starter.local.start(args, node.pid, log, cgroups)
            self.record.add_process(popen.pid, what)
            return popen
        if server is None:
            popen = node.popen(cmd, stdout=out, stderr=out, stdin=None, env=env)
            self.record.add_process(popen.pid, what)
            return popen
        from .cluster import agent_environment
        there = starter.remote.get(server) if args is not None else None
        # what ``env`` adds to this process's environment goes there on the command line
        added = {k: v for k, v in env.items() if os.environ.get(k) != v}
        popen = (node.launch_forked(args, log, there, cgroups) if there is not None
                 else node.launch_begin(cmd, log, {**agent_environment(), **added}))
        self.record.add_process(popen.pid, f"ssh to {what}")
        self._starting.append((node, popen, what))
        if wait:
            self.started()
        return popen

    def switch_program(self) -> dict:
        """What runs the switches (target, and for BMv2 which build)."""
        return self.net.switches[0].target.describe()

    def switch_death(self, wait: float = 0.2) -> TargetError | None:
        """The TargetError of the first switch whose process has ended (how, and its
        log), or None; ``wait``: seconds to look again, as a failed P4Runtime call is
        how a switch's death shows first and its process may still be ending."""
        deadline = time.monotonic() + wait
        while True:
            for sw in self.net.switches if self.net is not None else []:
                try:
                    if sw.target is not None:
                        sw.target.check_alive()
                except TargetError as exc:
                    return exc
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.05)

    def watch(self, echo, every: float = 1.0):
        """Wait until interrupted (Ctrl-C: KeyboardInterrupt), saying once when a
        switch's process has ended (a held run: what is left stays up)."""
        said = False
        while True:
            time.sleep(every)
            death = None if said else self.switch_death(wait=0)
            if death is not None:
                echo(f"{death}; the rest stays up until Ctrl-C")
                said = True

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
    def stop(self, said=None):
        """Stop everything; if Mininet cannot (a shell left mid-command), remove what
        the run record lists instead. Raises only if something is still left.
        ``said(line)``: a node's shell that stopped answering was given up on."""
        for t in self._freeing:
            t.join(30)
        for conn in self.conns.values():
            try:
                conn.close()
            except Exception:  # the switch may already be gone
                pass
        self.conns.clear()
        try:  # remote processes whose PID was not read yet (the run stopped between)
            self.started()
        except RuntimeError:
            pass
        for node, pid in self.remote_procs:  # agents that outlived their ssh session
            node.kill_remote(pid)
        self.remote_procs.clear()
        problem = None
        if self.net is not None and self.nft_loss:  # what the rules lost, before they go
            self.link_loss = link_losses(self.net, self.loss_table)
        if self.net is not None:
            for sw in self.net.switches:
                sw.stop_soon()
            bound_shell_commands(self.net, said)  # Mininet would wait on them for ever
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
            self._remove_remote_loss()
        if self.mininet_log is not None:
            self.mininet_log.close()
            self.mininet_log = None
        left = self.record.leftovers(but_last=True)  # the run's ssh masters end after it
        if left:
            raise RuntimeError(f"teardown left {', '.join(left)}"
                               + (f" ({problem!r})" if problem else ""))
