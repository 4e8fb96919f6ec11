"""The embedded switch's P4Runtime server: p4runtime-shell works against it, and
requests it does not serve get a proper gRPC status."""

from __future__ import annotations

import pytest
from p4.config.v1 import p4info_pb2
from p4.v1 import p4runtime_pb2

from conftest import IS_ROOT, SwitchLab
from qaina_bench.harness.control import ControlError, SwitchConnection

pytestmark = pytest.mark.skipif(not IS_ROOT, reason="needs root: veth pairs, raw sockets")


@pytest.fixture(scope="module")
def emb(tmp_path_factory):
    lab = SwitchLab("embedded", 2, tmp_path_factory.mktemp("p4rt"))
    yield lab
    lab.close()


@pytest.fixture
def fresh(emb):
    emb.reset()
    return emb


def test_p4runtime_shell_connects_lists_and_writes_tables(fresh):
    import p4runtime_sh.shell as sh
    from p4runtime_sh.context import P4Type

    sh.setup(device_id=1, grpc_addr=fresh.target.grpc_addr, election_id=(1, 0), verbose=False)
    try:
        tables = {name for name, _ in sh.context.get_objs(P4Type.table)}
        assert tables == {"MyIngress.ipv4_lpm", "MyIngress.aggregator_addr",
                          "MyIngress.job_table", "MyIngress.member_table",
                          "MyEgress.result_rewrite"}
        te = sh.TableEntry("MyIngress.job_table")(action="MyIngress.set_job")
        te.match["hdr.qaina.job_id"] = "5"
        for name, value in dict(job_index=1, n_workers=4, slot_base=0, slot_count=8,
                                mcast_grp=2, bits=4, lane_width=6, lanes=5).items():
            te.action[name] = str(value)
        te.insert()
        read = list(sh.TableEntry("MyIngress.job_table").read())
        assert len(read) == 1 and read[0].match["hdr.qaina.job_id"].exact.value == b"\x05"
        lpm = sh.TableEntry("MyIngress.ipv4_lpm")(action="MyIngress.forward")
        lpm.match["hdr.ipv4.dstAddr"] = "10.0.0.0/24"
        lpm.action["port"] = "2"
        lpm.insert()
        drops = list(sh.CounterEntry("MyIngress.drops").read())
        assert len(drops) == 16
    finally:
        sh.teardown()
    # What the shell wrote is what the switch holds.
    entries = fresh.conn.read_table("MyIngress.job_table")
    assert len(entries) == 1
    assert [p.value for p in entries[0].action.action.params][1] == b"\x04"


def test_errors_are_grpc_statuses(fresh):
    conn = fresh.conn
    conn.insert("MyIngress.aggregator_addr", {"hdr.ipv4.dstAddr": 1}, "MyIngress.accept_qaina")
    with pytest.raises(ControlError, match="ALREADY_EXISTS"):
        conn.insert("MyIngress.aggregator_addr", {"hdr.ipv4.dstAddr": 1},
                    "MyIngress.accept_qaina")
    with pytest.raises(ControlError, match="NOT_FOUND"):
        conn.delete("MyIngress.aggregator_addr", {"hdr.ipv4.dstAddr": 2},
                    "MyIngress.accept_qaina")
    with pytest.raises(ControlError, match="INVALID_ARGUMENT"):  # bits beyond the prefix
        conn.insert("MyIngress.ipv4_lpm", {"hdr.ipv4.dstAddr": (0x0A000001, 24)},
                    "MyIngress.forward", {"port": 1})

    def raw_write(update):
        req = p4runtime_pb2.WriteRequest(device_id=1)
        req.election_id.low = 1
        req.updates.append(update)
        return conn._call("write", conn.stub.Write, req)

    u = p4runtime_pb2.Update(type=p4runtime_pb2.Update.INSERT)
    u.entity.table_entry.table_id = 0x02FFFFFF
    with pytest.raises(ControlError, match="NOT_FOUND"):
        raw_write(u)
    u = p4runtime_pb2.Update(type=p4runtime_pb2.Update.INSERT)
    u.entity.meter_entry.meter_id = 1
    with pytest.raises(ControlError, match="UNIMPLEMENTED"):
        raw_write(u)
    u = p4runtime_pb2.Update(type=p4runtime_pb2.Update.INSERT)
    e = u.entity.table_entry
    e.CopyFrom(conn.table_entry("MyIngress.ipv4_lpm", {"hdr.ipv4.dstAddr": (0x0A000000, 8)},
                                "MyIngress.forward", {"port": 1}))
    e.action.action.params[0].value = b"\x02\x00"  # 512 does not fit bit<9>
    with pytest.raises(ControlError, match="INVALID_ARGUMENT"):
        raw_write(u)


def test_only_the_primary_writes_and_foreign_programs_are_refused(fresh):
    backup = SwitchConnection("backup", fresh.target.grpc_addr, 1, election_id=(0, 0))
    try:
        with pytest.raises(ControlError, match="not primary"):
            backup.arbitrate()
        with pytest.raises(ControlError, match="PERMISSION_DENIED"):
            backup.insert("MyIngress.aggregator_addr", {"hdr.ipv4.dstAddr": 3},
                          "MyIngress.accept_qaina")
    finally:
        backup.close()
    other = SwitchConnection("s1", fresh.target.grpc_addr, 1)
    other.p4info.proto = p4info_pb2.P4Info()  # a program that is not qaina.p4
    other.election_id = fresh.conn.election_id
    with pytest.raises(ControlError, match="INVALID_ARGUMENT"):
        other.set_pipeline()
    other.close()
    wrong_device = SwitchConnection("s1", fresh.target.grpc_addr, 9)
    with pytest.raises(ControlError, match="NOT_FOUND"):
        wrong_device.read_counter("drops")
    wrong_device.close()


def test_registers_and_pipeline_config_read_back(fresh):
    regs = fresh.conn.read_register("MyIngress.agg_count")
    assert len(regs) == 2048 and not any(regs.values())
    assert fresh.conn.read_register("MyIngress.agg_sum", index=65535) == {65535: 0}
    req = p4runtime_pb2.GetForwardingPipelineConfigRequest(device_id=1)
    cfg = fresh.conn.stub.GetForwardingPipelineConfig(req).config
    assert {t.preamble.name for t in cfg.p4info.tables} == {
        t.name for t in fresh.conn.p4info.tables.values()}
