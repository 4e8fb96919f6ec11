"""The embedded switch's own limits, beyond what both targets share: a port whose link
goes down and comes back (said once, counted, no busy loop on the error its ring
socket reports), and a Read that asks for more than it answers."""

from __future__ import annotations

import json
import time

import psutil
import pytest

from conftest import SwitchLab, ip, open_lab
from qaina_bench.harness.switches.control import ControlError
from qaina_bench.p4.proto import p4runtime_pb2

pytestmark = pytest.mark.root


def cpu_seconds(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return times.user + times.system


def test_a_port_whose_link_flaps_is_counted_and_leaves_the_switch_idle(tmp_path):
    lab = SwitchLab("embedded", 2, tmp_path)
    try:
        sw, _ = lab.veths.pairs[1]
        ip("link", "set", sw, "down")
        time.sleep(0.3)
        ip("link", "set", sw, "up")
        time.sleep(0.5)
        proc = psutil.Process(lab.target.pid)
        before = cpu_seconds(proc)
        time.sleep(2.0)
        used = cpu_seconds(proc) - before
        # idle it polls 5 times a second; spinning on the error it took about a core
        assert used < 0.5, f"the idle switch took {used:.2f} CPU s in 2 s after the flap"
        log = (tmp_path / "s1.log").read_text()
        assert f"port 1 ({sw}): ENETDOWN" in log, log[-2000:]
        lab.target.stop()
        stats = json.loads(lab.target.stats_path.read_text())
        assert stats[sw]["link_errors"] >= 1 and stats[sw]["rx_mode"] == "ring", stats
    finally:
        lab.close()


def test_a_read_of_wildcards_past_the_limit_is_refused_whole(tmp_path_factory):
    """Every cell of ``agg_sum`` many times over in one small request: the embedded
    switch refuses it before it builds the answer (a limit of its own: BMv2 builds it)."""
    from qaina_bench.p4.embedded.runtime import READ_MAX
    lab = open_lab("embedded", tmp_path_factory, ports=1)
    try:
        lab.reset()  # the pipeline installed
        conn = lab.conn
        reg = conn.p4info.register("MyIngress.agg_sum")
        req = p4runtime_pb2.ReadRequest(device_id=1)
        for _ in range(READ_MAX // reg.size + 1):
            req.entities.add().register_entry.register_id = reg.id
        with pytest.raises(ControlError, match="RESOURCE_EXHAUSTED"):
            conn._call("read", lambda r, timeout: list(conn.stub.Read(r, timeout=timeout)), req)
        assert len(conn.read_register("MyIngress.agg_count")) > 0  # still serving
        # The same with table entries: 1,024 routes, every table's entries asked for
        # 1,025 times over (before, 1 M entities were built: about 450 MB).
        conn.insert_many([("MyIngress.ipv4_lpm", {"hdr.ipv4.dstAddr": (0x0A000000 + (k << 8), 24)},
                           "MyIngress.forward", {"port": 1}) for k in range(1024)])
        req = p4runtime_pb2.ReadRequest(device_id=1)
        for _ in range(READ_MAX // 1024 + 1):
            req.entities.add().table_entry.table_id = 0
        rss = psutil.Process(lab.target.pid).memory_info().rss
        with pytest.raises(ControlError, match="RESOURCE_EXHAUSTED"):
            conn._call("read", lambda r, timeout: list(conn.stub.Read(r, timeout=timeout)), req)
        grown = psutil.Process(lab.target.pid).memory_info().rss - rss
        assert grown < 64 << 20, f"the refused Read grew the switch by {grown >> 20} MB"
        assert len(conn.read_table("MyIngress.ipv4_lpm")) == 1024
    finally:
        lab.close()


def test_multicast_groups_are_bounded(tmp_path_factory):
    """A group of ``MAX_REPLICAS`` distinct replicas is taken (its duplicate check is
    one set lookup per replica); one more is RESOURCE_EXHAUSTED, and so is a group that
    would take the replicas of all groups past ``MAX_ALL_REPLICAS`` (a copy of a result
    per replica, and memory per replica: the limits bound what writes can order)."""
    from qaina_bench.p4.embedded.updates import MAX_ALL_REPLICAS, MAX_REPLICAS
    lab = open_lab("embedded", tmp_path_factory, ports=1)
    try:
        lab.reset()
        conn = lab.conn
        many = [(1 + k % 511, k // 511) for k in range(MAX_REPLICAS)]
        conn.set_multicast_group(7, many)
        got = conn._read("group", _group_entity(7))
        assert len(got[0].packet_replication_engine_entry.multicast_group_entry.replicas) \
            == MAX_REPLICAS
        with pytest.raises(ControlError, match="RESOURCE_EXHAUSTED"):
            conn.set_multicast_group(8, many + [(1, 999)])
        assert not conn._read("group", _group_entity(8))
        full = MAX_ALL_REPLICAS // MAX_REPLICAS
        for gid in range(8, 7 + full):  # every replica the switch holds, in full groups
            conn.set_multicast_group(gid, many)
        with pytest.raises(ControlError, match="RESOURCE_EXHAUSTED: multicast group 99: "
                                               "this switch holds at most 65536 replicas"):
            conn.set_multicast_group(99, [(1, 1)])
        assert not conn._read("group", _group_entity(99))
        conn.set_multicast_group(7, many[:-1], insert=False)  # a MODIFY counts its own once
        conn.set_multicast_group(99, [(1, 1)])
        with pytest.raises(ControlError, match="RESOURCE_EXHAUSTED"):
            conn.set_multicast_group(7, many, insert=False)
        conn.delete_multicast_group(8)
        conn.set_multicast_group(7, many, insert=False)
        lab.reset()  # every group id, in one batch (the cap is kept as a running total)
        req = p4runtime_pb2.WriteRequest(device_id=1)
        req.election_id.high, req.election_id.low = conn.election_id
        for gid in range(1, 1 << 16):
            u = req.updates.add(type=p4runtime_pb2.Update.INSERT)
            g = u.entity.packet_replication_engine_entry.multicast_group_entry
            g.multicast_group_id = gid
            g.replicas.add(egress_port=1, instance=gid)
        conn._call("write", conn.stub.Write, req)
        assert conn._read("group", _group_entity(65535))
        conn.set_multicast_group(7, [(1, 7), (2, 7)], insert=False)  # replica 65,536
        with pytest.raises(ControlError, match="RESOURCE_EXHAUSTED"):
            conn.set_multicast_group(8, [(1, 8), (2, 8)], insert=False)
    finally:
        lab.close()


def _group_entity(gid: int) -> p4runtime_pb2.Entity:
    e = p4runtime_pb2.Entity()
    e.packet_replication_engine_entry.multicast_group_entry.multicast_group_id = gid
    return e


@pytest.mark.parametrize("kind", ["embedded", "embedded-sockets"])
def test_a_frame_longer_than_a_port_takes_is_dropped_and_counted_not_cut(tmp_path, kind):
    """With the links' MTU raised, a frame longer than the switch's frame buffers is
    dropped whole and counted (``rx_oversize``), never forwarded cut short; the
    frames around it are forwarded as they came."""
    from scapy.all import IP, UDP, Ether, raw

    from qaina_bench.harness.switches.jobs import program_route
    from qaina_bench.p4.embedded.ports import FRAME_LONGEST

    lab = SwitchLab(kind, 2, tmp_path)
    try:
        for pair in lab.veths.pairs.values():
            for ifname in pair:
                ip("link", "set", ifname, "mtu", "4000")
        lab.reset()
        program_route(lab.conn, 0x0A000105, 32, 2)  # 10.0.1.5

        def frame(size: int) -> bytes:
            head = Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02") / IP(
                src="10.0.0.1", dst="10.0.1.5", ttl=9) / UDP(sport=1, dport=2)
            return raw(head / bytes(size - len(raw(head))))

        # One alone: a read of nothing but dropped frames still gives its slots back
        # (it was read again and again, a core spinning).
        lab.hosts[1].send(frame(3000))
        time.sleep(0.5)
        proc = psutil.Process(lab.target.pid)
        before = cpu_seconds(proc)
        time.sleep(2.0)
        used = cpu_seconds(proc) - before
        sizes = [200, FRAME_LONGEST, 3000, FRAME_LONGEST + 1, 300]
        for size in sizes:
            lab.hosts[1].send(frame(size))
        got = lab.hosts[2].recv(timeout=10.0, count=3)
        sw = lab.veths.pairs[1][0]
        lab.target.stop()
        stats = json.loads(lab.target.stats_path.read_text())
    finally:
        lab.close()
    assert used < 0.5, f"the switch took {used:.2f} CPU s in 2 s after one long frame"
    assert [len(f) for f in got] == [200, FRAME_LONGEST, 300]
    assert stats[sw]["rx_oversize"] == 3, stats[sw]
    log = (tmp_path / "s1.log").read_text()
    assert f"port 1 ({sw}): a frame of 3000 bytes is longer than the {FRAME_LONGEST}" in log
