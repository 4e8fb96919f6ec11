"""P4Runtime Write validation: every kind of invalid Write gets the P4Runtime
specification's answer (1.4.1: "Table Entry", "Bytestrings", "Counter Entry",
"Multicast Group Entry", "Error Reporting") from the embedded switch, and the same
from BMv2 but for the departures listed below.

Each case is one Write on a fresh pipeline; its answer is the canonical code of
every update (one ``p4.v1.Error`` per update in the status's details, as the spec
says, or a Write that succeeds). Where BMv2 ``simple_switch_grpc`` (1.15.5, PI
f96af95) departs from the spec, the embedded switch follows the spec and the case
pins BMv2's answer (``bmv2=``); p4/README.md ("P4Runtime servers") lists them.
"""

from __future__ import annotations

import grpc
import pytest

from conftest import root
from qaina_bench.harness.switches.control import update_errors
from qaina_bench.p4.proto import code_pb2, p4runtime_pb2
from write_cases import AGG, CASES, LPM, U, agg, case, member, modify_default, route, upd

pytestmark = root


def counter_update(conn, kind, index=3, name="MyIngress.drops", packets=7):
    u = U(type=kind)
    c = u.entity.counter_entry
    c.counter_id = conn.p4info.counter(name).id
    if index is not None:
        c.index.index = index
    c.data.packet_count = packets
    c.data.byte_count = packets * 100
    return u


@case("OK")
def counter_modify(conn):
    return [counter_update(conn, U.MODIFY)]


@case("OK", bmv2="UNIMPLEMENTED")
def counter_modify_all(conn):
    return [counter_update(conn, U.MODIFY, index=None)]


@case("OUT_OF_RANGE", bmv2="UNKNOWN")
def counter_index_out_of_range(conn):
    return [counter_update(conn, U.MODIFY, index=16)]


@case("INVALID_ARGUMENT")
def counter_negative_index(conn):
    return [counter_update(conn, U.MODIFY, index=-1)]


@case("INVALID_ARGUMENT", bmv2="OK")
def counter_negative_counts(conn):
    return [counter_update(conn, U.MODIFY, packets=-5)]


@case("INVALID_ARGUMENT")
def counter_insert(conn):
    return [counter_update(conn, U.INSERT)]


@case("INVALID_ARGUMENT", bmv2="OK")
def counter_delete(conn):
    return [counter_update(conn, U.DELETE)]


@case("INVALID_ARGUMENT")
def counter_unknown_id(conn):
    u = counter_update(conn, U.MODIFY)
    u.entity.counter_entry.counter_id = 0x12FFFFFF
    return [u]


@case("INVALID_ARGUMENT")
def table_update_of_no_type(conn):
    conn._write("setup", [upd(U.INSERT, route(conn, (0x0A000009, 32), 1))])
    return [upd(7, route(conn, (0x0A000009, 32), 3))]


@case("INVALID_ARGUMENT")
def mcast_update_of_no_type(conn):
    conn.set_multicast_group(5, [(1, 1)])
    return [mcast(9, 5)]


def register_update(conn, kind, index=3):
    u = U(type=kind)
    r = u.entity.register_entry
    r.register_id = conn.p4info.register("MyIngress.agg_count").id
    if index is not None:
        r.index.index = index
    r.data.bitstring = b"\x05"
    return u


@case("OK", bmv2="UNIMPLEMENTED")
def register_modify(conn):
    return [register_update(conn, U.MODIFY)]


@case("OUT_OF_RANGE", bmv2="UNIMPLEMENTED")
def register_index_out_of_range(conn):
    return [register_update(conn, U.MODIFY, index=4096)]


@case("INVALID_ARGUMENT", bmv2="UNIMPLEMENTED")
def register_insert(conn):
    return [register_update(conn, U.INSERT)]


def mcast(kind, gid, replicas=((1, 1), (2, 2))):
    u = U(type=kind)
    g = u.entity.packet_replication_engine_entry.multicast_group_entry
    g.multicast_group_id = gid
    for port, rid in replicas:
        g.replicas.add(egress_port=port, instance=rid)
    return u


@case("OK")
def mcast_insert(conn):
    return [mcast(U.INSERT, 5)]


@case("INVALID_ARGUMENT")
def mcast_group_zero(conn):
    return [mcast(U.INSERT, 0)]


@case("OUT_OF_RANGE")
def mcast_group_past_16_bits(conn):  # v1model's mcast_grp is bit<16>
    return [mcast(U.INSERT, 1 << 16)]


@case("ALREADY_EXISTS")
def mcast_insert_existing(conn):
    conn.set_multicast_group(5, [(1, 1)])
    return [mcast(U.INSERT, 5)]


@case("NOT_FOUND")
def mcast_modify_missing(conn):
    return [mcast(U.MODIFY, 5)]


@case("NOT_FOUND")
def mcast_delete_missing(conn):
    return [mcast(U.DELETE, 5)]


@case("INVALID_ARGUMENT")
def mcast_duplicate_replica(conn):
    return [mcast(U.INSERT, 5, ((1, 1), (1, 1)))]


@case("OK")
def mcast_same_port_two_instances(conn):
    return [mcast(U.INSERT, 5, ((1, 1), (1, 2)))]


@case("OK")
def mcast_no_replicas(conn):
    return [mcast(U.INSERT, 5, ())]


@case("INVALID_ARGUMENT")
def mcast_update_unspecified(conn):
    return [mcast(U.UNSPECIFIED, 5)]


@case("UNIMPLEMENTED", bmv2="OK")
def clone_session(conn):
    u = U(type=U.INSERT)
    s = u.entity.packet_replication_engine_entry.clone_session_entry
    s.session_id = 5
    s.replicas.add(egress_port=1, instance=1)
    return [u]


@case("INVALID_ARGUMENT")
def direct_counter_entry(conn):
    u = U(type=U.MODIFY)
    u.entity.direct_counter_entry.table_entry.CopyFrom(agg(conn))
    return [u]


@case(["OK", "INVALID_ARGUMENT", "OK"])
def batch_valid_invalid_valid(conn):
    bad = agg(conn, 12)
    bad.match.add().CopyFrom(bad.match[0])
    return [upd(U.INSERT, agg(conn, 11)), upd(U.INSERT, bad), upd(U.INSERT, agg(conn, 13))]


@case(["OK", "ALREADY_EXISTS"])
def batch_insert_twice(conn):
    return [upd(U.INSERT, agg(conn, 11)), upd(U.INSERT, agg(conn, 11))]


@case("OK")
def empty_batch(conn):
    return []


@case("INVALID_ARGUMENT", bmv2="OK")
def mcast_instance_too_wide(conn):
    return [mcast(U.INSERT, 5, ((1, 70000),))]


@case("INVALID_ARGUMENT", bmv2="OK")
def mcast_port_too_wide(conn):
    return [mcast(U.INSERT, 5, ((1000, 1),))]


@case("UNIMPLEMENTED", bmv2="OK")
def mcast_backup_replica(conn):
    u = mcast(U.INSERT, 5, ((1, 1),))
    g = u.entity.packet_replication_engine_entry.multicast_group_entry
    g.replicas[0].backup_replicas.add(port=b"\x02", instance=1)
    return [u]


@case("OK")
def mcast_metadata(conn):
    u = mcast(U.INSERT, 5, ((1, 1),))
    u.entity.packet_replication_engine_entry.multicast_group_entry.metadata = b"abc"
    return [u]


@case("OK")
def mcast_port_bytes(conn):
    u = mcast(U.INSERT, 5, ())
    g = u.entity.packet_replication_engine_entry.multicast_group_entry
    g.replicas.add(port=b"\x01", instance=1)
    return [u]


@case("OK")
def table_entry_metadata(conn):
    e = agg(conn)
    e.metadata = b"abc"
    e.controller_metadata = 7
    return [upd(U.INSERT, e)]


@case("INVALID_ARGUMENT")
def meter_config_without_meter(conn):
    e = agg(conn)
    e.meter_config.cir = 1
    return [upd(U.INSERT, e)]


@case("INVALID_ARGUMENT")
def counter_data_without_counter(conn):
    e = agg(conn)
    e.counter_data.packet_count = 1
    return [upd(U.INSERT, e)]


@case("INVALID_ARGUMENT", bmv2="UNKNOWN")
def role_entity_unset(conn):
    return [U(type=U.INSERT)]


@case("UNIMPLEMENTED")
def value_set_entry(conn):
    u = U(type=U.MODIFY)
    u.entity.value_set_entry.value_set_id = 0x03000001
    return [u]


@case("OK")
def member_padded_key_then_canonical_delete(conn):
    e = member(conn)
    e.match[0].exact.value = b"\x00\x01"
    conn._write("setup", [upd(U.INSERT, e)])
    return [upd(U.DELETE, member(conn))]


def write(conn, updates) -> list[str]:
    """The canonical code of every update of one Write (all "OK" if it succeeds)."""
    req = p4runtime_pb2.WriteRequest(device_id=conn.device_id, updates=updates)
    req.election_id.high, req.election_id.low = conn.election_id
    try:
        conn.stub.Write(req, timeout=10)
    except grpc.RpcError as exc:
        # A failed update makes the whole Write UNKNOWN, its errors in the details.
        assert exc.code() == grpc.StatusCode.UNKNOWN, exc
        errors = update_errors(exc)
        assert len(errors) == len(updates), exc
        return [code_pb2.Code.Name(e.canonical_code) for e in errors]
    return ["OK"] * len(updates)


@pytest.mark.parametrize("name", CASES)
def test_a_write_gets_the_specs_answer(fresh, name):
    build, spec, bmv2 = CASES[name]
    expected = bmv2 if fresh.kind == "bmv2" and bmv2 is not None else spec
    updates = build(fresh.conn)
    expected = expected if isinstance(expected, list) else [expected] * max(1, len(updates))
    assert write(fresh.conn, updates) == expected[:len(updates)]


def test_refused_updates_change_nothing(fresh):
    """Every update of a batch is attempted; the refused ones leave no trace."""
    conn = fresh.conn
    codes = write(conn, batch_valid_invalid_valid(conn) + [
        upd(U.INSERT, route(conn, (0x0A000000, 8), 1))])
    assert codes == ["OK", "INVALID_ARGUMENT", "OK", "OK"]
    held = {e.match[0].exact.value for e in conn.read_table(AGG)}
    assert held == {b"\x0b", b"\x0d"}
    for name in ("empty_exact_value", "param_twice_other_value", "priority_on_exact",
                 "match_field_twice_other_value"):
        build, spec, _ = CASES[name]
        write(conn, build(conn))
    routes = conn.read_table(LPM)
    assert len(routes) == 1 and routes[0].action.action.params[0].value == b"\x01"
    held = {e.match[0].exact.value for e in conn.read_table(AGG)}
    if fresh.kind == "embedded":
        assert held == {b"\x0b", b"\x0d"}
    else:  # BMv2 took the empty bytestring as 0
        assert held == {b"\x0b", b"\x0d", b"\x00"}


def test_a_counter_cell_written_reads_back(fresh):
    conn = fresh.conn
    assert write(conn, counter_modify(conn)) == ["OK"]
    cells = conn.read_counter("MyIngress.drops")
    assert cells[3] == (7, 700) and cells[2] == (0, 0)


def test_the_default_entry_modified_without_an_action_is_the_programs_again(fresh):
    conn = fresh.conn
    assert write(conn, modify_default(conn)) == ["OK"]  # ipv4_lpm's: forward(3)
    reset = conn.table_entry(LPM, {}, "MyIngress.forward", {"port": 3}, default=True)
    reset.ClearField("action")
    assert write(conn, [upd(U.MODIFY, reset)]) == ["OK"]
    query = p4runtime_pb2.TableEntry(table_id=conn.p4info.table(LPM).id, is_default_action=True)
    entity = p4runtime_pb2.Entity(table_entry=query)
    (entry,) = [e.table_entry for e in conn._read("default entry", entity)]
    assert entry.action.action.action_id == conn.p4info.action("MyIngress.no_route").id


def test_an_entrys_metadata_reads_back(fresh):
    """controller_metadata and metadata are kept with an entry and returned (spec,
    "Table Entry"); a MODIFY replaces them."""
    conn = fresh.conn
    e = agg(conn)
    e.controller_metadata, e.metadata = 7, b"abc"
    assert write(conn, [upd(U.INSERT, e)]) == ["OK"]
    (read,) = conn.read_table(AGG)
    assert (read.controller_metadata, read.metadata) == (7, b"abc")
    e.controller_metadata, e.metadata = 8, b""
    assert write(conn, [upd(U.MODIFY, e)]) == ["OK"]
    (read,) = conn.read_table(AGG)
    assert (read.controller_metadata, read.metadata) == (8, b"")
    default = modify_default(conn)[0].entity.table_entry  # the default entry's, kept too
    default.controller_metadata, default.metadata = 5, b"x"
    assert write(conn, [upd(U.MODIFY, default)]) == ["OK"]
    query = p4runtime_pb2.TableEntry(table_id=conn.p4info.table(LPM).id, is_default_action=True)
    (read,) = [e.table_entry for e in conn._read("default entry",
                                                 p4runtime_pb2.Entity(table_entry=query))]
    assert (read.controller_metadata, read.metadata) == (5, b"x")


def test_a_read_by_key_with_a_priority_the_table_cannot_have_is_refused(fresh):
    """An exact table's entries have no priority: a Read naming one is INVALID_ARGUMENT,
    as a Write with it is (spec, "Table Entry")."""
    conn = fresh.conn
    e = agg(conn)
    assert write(conn, [upd(U.INSERT, e)]) == ["OK"]
    e.ClearField("action")
    e.priority = 5
    req = p4runtime_pb2.ReadRequest(device_id=conn.device_id)
    req.entities.add().table_entry.CopyFrom(e)
    with pytest.raises(grpc.RpcError) as err:
        list(conn.stub.Read(req, timeout=10))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value
