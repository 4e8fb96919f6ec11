"""Real Mininet runs as root against hostile hosts: datagrams from a host outside the
job and forged aggregates are refused by the switch and reported, and every port of
a leaf-spine admits only the sources its routes bring."""

from __future__ import annotations

import csv
import shutil
import subprocess
import sys
import time

import pytest

from qaina_bench.harness.config import RunConfig
from qaina_bench.harness.switches.jobs import aggregator_ip, aggregator_mac
from qaina_bench.harness.running.run import Run
from qaina_bench.hosts.lanes import LaneFormat
# target is the suites' fixture
from testbed_lab import check_exact_aggregates, target

pytestmark = [
    pytest.mark.root,  # Mininet
    pytest.mark.skipif(shutil.which("mnexec") is None,
                       reason="mnexec missing: apt-get install mininet"),
]


FORGER = """
import socket, struct, sys, time
from qaina_bench.p4.header import QAINA_STRUCT, QAINA_UDP_PORT, QAINA_WORDS
target, job, worker, flags = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[5])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
junk = struct.pack("!%dI" % QAINA_WORDS, *([0x5A5A5A5A] * QAINA_WORDS))
end = time.monotonic() + float(sys.argv[4])
while time.monotonic() < end:
    try:
        for seq in range(400):
            s.sendto(QAINA_STRUCT.pack(job, worker, flags, 0, 0, 0, seq) + junk,
                     (target, QAINA_UDP_PORT))
    except OSError:  # the run ended first and took the host's network with it
        break
    time.sleep(0.01)
"""

#: Raw frames from a host: RESULTs for job 1's worker 0 with the aggregator's address
#: and port (and, one in 50, with the host's own address), every sequence number in
#: turn, until the host's interface is gone; after every batch it writes to a file
#: how many of each it sent, and when it sent the first and the last.
FRAME_FORGER = """
import os, socket, struct, sys, time
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from qaina_bench.p4.header import FLAG_RESULT, QAINA_AT, QAINA_UDP_PORT, scapy_layer
iface, dst_mac, dst_ip, agg_mac, agg_ip, own_ip, words, report = sys.argv[1:9]
QAINA = scapy_layer()

def frame(src):
    return bytearray(bytes(Ether(src=agg_mac, dst=dst_mac) / IP(src=src, dst=dst_ip)
                           / UDP(sport=QAINA_UDP_PORT, dport=QAINA_UDP_PORT, chksum=0)
                           / QAINA(job_id=1, worker=0, flags=FLAG_RESULT, exp=3,
                                   words=[0x5A5A5A5A] * int(words))))

spoofed, own = frame(agg_ip), frame(own_ip)
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
s.bind((iface, 0))
sent, seq, first, end = [0, 0], 0, time.time(), time.monotonic() + 120
while time.monotonic() < end:
    try:
        for _ in range(50):
            struct.pack_into("!I", spoofed, QAINA_AT["seq"], seq % 400)
            s.send(spoofed)
            sent[0] += 1
            seq += 1
        struct.pack_into("!I", own, QAINA_AT["seq"], seq % 400)
        s.send(own)
        sent[1] += 1
    except OSError:  # the run ended and took the host's network with it
        break
    with open(report + ".tmp", "w") as f:
        f.write(f"{sent[0]} {sent[1]} {first} {time.time()}")
    os.replace(report + ".tmp", report)
    time.sleep(0.01)
"""


def run_with(cfg: RunConfig, host: str, command, event="agents_go",
             ready=None) -> tuple[dict, Run, object]:
    """Run ``cfg``; at ``event`` of the run, host ``host`` starts ``command(run)``
    (argv); with ``ready``, the agents go only once ``ready()`` is true (the process
    is under way, however long it took to start). Returns the summary, the run and
    the process started."""
    import threading
    run = Run(cfg, echo=lambda *a, **k: None)
    started = []
    if ready is not None:
        agents_ready = run._await_agents

        def await_agents_and_ready():
            agents_ready()
            deadline = time.monotonic() + 60
            while not ready() and time.monotonic() < deadline:
                time.sleep(0.05)
        run._await_agents = await_agents_and_ready

    def start():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and event not in run.events:
            time.sleep(0.05)
        started.append(run.testbed.host(host).popen(command(run), stdout=subprocess.PIPE,
                                                    text=True))

    thread = threading.Thread(target=start)
    thread.start()
    summary = run.execute()
    thread.join()
    assert started, "the agents never went"
    return summary, run, started[0]


def test_datagrams_from_another_host_are_refused_and_reported(tmp_path):
    """Job 2's host floods job 1's worker with QAINA datagrams for every sequence
    number (not results: the switch routes them); the worker takes results only from
    its aggregator, stays exact, and the run says packets were refused."""
    from qaina_bench.p4.header import FLAG_RETX
    # 12 iterations at 0.5 Mbit/s: the job lasts seconds, so the forger (started when
    # the agents go) floods it while it runs, also on a loaded machine
    cfg = RunConfig.flat(results_dir=str(tmp_path), record_levels=True, topo="star", jobs=2,
                    workers=2, bits=[8], iterations=12, bw=0.5)
    summary, run, forger = run_with(cfg, "h3", lambda run: [
        sys.executable, "-c", FORGER, run.testbed.host("h1").IP(), "1", "0", "3",
        str(FLAG_RETX)])
    assert forger.wait(30) == 0
    assert summary["complete"], summary["errors"]
    check_exact_aggregates(run.dir, summary)
    job1 = summary["jobs"][0]
    assert job1["rel_error_max"] < 0.1
    assert job1["refused"] > 0 and summary["validity"]["refused_packets"] == job1["refused"]
    assert any("refused" in w for w in summary["validity"]["warnings"])


def test_forged_aggregates_are_dropped_by_the_switch(tmp_path, target):
    """The attack of a tenant on another: during the run, job 2's host h3 sends job 1's
    worker h1 RESULT frames with the aggregator's address and port (which h1's agent
    would take), and some with its own address. The switch drops all of them at h3's
    port (spoofed_source, forged_result); job 1's sums stay exact and nothing forged
    reaches h1."""
    cfg = RunConfig.flat(results_dir=str(tmp_path / "run"), record_levels=True, target=target,
                    topo="star", jobs=2, workers=2, bits=[4], bw=1)
    report = tmp_path / "forger.txt"

    def command(run):
        h1, h3 = run.testbed.host("h1"), run.testbed.host("h3")
        return [sys.executable, "-c", FRAME_FORGER, h3.defaultIntf().name, h1.MAC(), h1.IP(),
                aggregator_mac(1), aggregator_ip(1), h3.IP(), str(cfg.network.payload_words),
                str(report)]

    # From the moment the switch is programmed; the agents go once it sends, so that it
    # sends while they run, however fast they start.
    summary, run, forger = run_with(cfg, "h3", command, event="programmed",
                                    ready=report.exists)
    forger.wait(30)
    assert report.exists(), forger.stderr.read()
    spoofed, own, first, last = (float(x) for x in report.read_text().split())
    assert summary["complete"], summary["errors"]
    check_exact_aggregates(run.dir, summary)
    rows = [r for r in csv.DictReader(open(run.dir / "iterations.csv")) if r["job"] == "1"]
    assert first < max(float(r["end"]) for r in rows) and last > run.events["agents_go"]
    drops = summary["drops"]["s1"]
    # The host's link (1 Mbit/s) drops what it cannot carry; every frame that reached
    # the switch was dropped there, under its reason.
    assert 0 < drops["spoofed_source"] <= spoofed and 0 < drops["forged_result"] <= own
    assert summary["jobs"][0]["refused"] == 0  # nothing forged reached h1
    assert summary["validity"]["forged_packets"] == {
        "spoofed_source": drops["spoofed_source"], "forged_result": drops["forged_result"]}
    assert any("spoofed_source" in w for w in summary["validity"]["warnings"])


def test_leafspine_ports_admit_the_sources_their_routes_bring(tmp_path, monkeypatch):
    """On a leaf-spine (h1, h3 on lf1; h2, h4 on lf2; sp1 aggregates), every switch port
    is guarded: a host port admits its host, a spine's port towards a leaf the hosts
    below that leaf, a leaf's uplinks the hosts below the other leaf between them,
    and only a leaf's uplink to sp1 admits sp1's results."""
    from qaina_bench.harness.switches.jobs import Job, ip_to_int
    from qaina_bench.harness.running.network import Testbed
    from qaina_bench.harness.running.record import RunRecord
    from qaina_bench.topologies.leafspine import LeafSpineTopo
    from qaina_bench.harness.running import network
    monkeypatch.setattr(network, "ARP_LINE", 80)  # the static ARP entries in 3 lines
    bed = Testbed(LeafSpineTopo(hosts=4, spines=2, leaves=2), "embedded", tmp_path,
                  RunRecord("srcval-leafspine", tmp_path))
    try:
        bed.start()
        hosts = ["h1", "h2", "h3", "h4"]
        for h in hosts:  # every host knows every other host's and aggregator's MAC
            table = {(w[0], w[w.index("lladdr") + 1]) for w in
                     (line.split() for line in bed.host(h).cmd("ip neigh show").splitlines())
                     if "PERMANENT" in w and "lladdr" in w}
            assert table == {(bed.host(o).IP(), bed.host(o).MAC()) for o in hosts if o != h} | {
                (aggregator_ip(d), aggregator_mac(d)) for d in bed.device_ids.values()}, h
        job = Job(1, 0, LaneFormat(4, 4), 0, 8,
                  [bed.worker(k, h, "sp1") for k, h in enumerate(hosts)])
        bed.program_aggregators(["sp1"])
        bed.install_job(bed.placements(job, "sp1"))
        ip = {h: ip_to_int(bed.host(h).IP()) for h in hosts}
        agg = ip_to_int(aggregator_ip(bed.device_ids["sp1"]))

        def port(sw, peer):
            a, b = bed.net.get(sw), bed.net.get(peer)
            return a.ports[a.connectionsTo(b)[0][0]]

        def admitted(sw):
            """port -> {source: results} of the switch's source_guard."""
            out = {}
            for e in bed.conns[sw].read_table("MyIngress.source_guard"):
                key = [int.from_bytes(m.exact.value, "big") for m in e.match]
                results = int.from_bytes(e.action.action.params[0].value, "big")
                out.setdefault(key[0], {})[key[1]] = results
            return out

        below = {"lf1": ["h1", "h3"], "lf2": ["h2", "h4"]}
        for sw in ("sp1", "sp2", "lf1", "lf2"):
            guarded = {int.from_bytes(e.match[0].exact.value, "big")
                       for e in bed.conns[sw].read_table("MyIngress.port_guard")}
            node = bed.net.get(sw)
            assert guarded == {node.ports[i] for i in node.intfList() if i.name != "lo"}
        for leaf, other in (("lf1", "lf2"), ("lf2", "lf1")):
            got = admitted(leaf)
            for h in below[leaf]:
                assert got[port(leaf, h)] == {ip[h]: 0}
            up1, up2 = got.get(port(leaf, "sp1"), {}), got.get(port(leaf, "sp2"), {})
            assert up1.pop(agg) == 1 and agg not in up2
            assert set(up1) | set(up2) == {ip[h] for h in below[other]}
            assert not any(up1.values()) and not any(up2.values())
            for spine in ("sp1", "sp2"):
                assert set(admitted(spine).get(port(spine, leaf), {})) <= {
                    ip[h] for h in below[leaf]}
            assert set(admitted("sp1")[port("sp1", leaf)]) == {ip[h] for h in below[leaf]}
    finally:
        bed.stop()
