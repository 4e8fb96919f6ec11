"""The table-entry cases of the P4Runtime Write suite (``test_p4runtime_write.py``
runs them): each builds one Write and names the specification's answer, and BMv2's
where it departs. ``case`` registers a case in ``CASES``.
"""

from __future__ import annotations

from qaina_bench.p4.proto import p4runtime_pb2

U = p4runtime_pb2.Update
AGG = "MyIngress.aggregator_addr"
LPM = "MyIngress.ipv4_lpm"
MEM = "MyIngress.member_table"

#: case name -> (the function that builds the Write's updates, the spec's answer,
#: BMv2's answer where it departs from the spec)
CASES: dict = {}


def case(spec, bmv2=None):
    """A case whose Write is answered ``spec`` (a code for a one-update Write, a list
    of codes for a batch; "OK" for success) by the spec and by the embedded switch,
    and ``bmv2`` by BMv2 where it departs."""
    def register(fn):
        CASES[fn.__name__] = (fn, spec, bmv2)
        return fn
    return register


def upd(kind, entry=None):
    u = U(type=kind)
    if entry is not None:
        u.entity.table_entry.CopyFrom(entry)
    return u


def agg(conn, addr=5):
    return conn.table_entry(AGG, {"hdr.ipv4.dstAddr": addr}, "MyIngress.accept_qaina")


def route(conn, addr=(0x0A000000, 8), port=1):
    return conn.table_entry(LPM, {"hdr.ipv4.dstAddr": addr}, "MyIngress.forward", {"port": port})


def member(conn):
    return conn.table_entry(MEM, {"hdr.qaina.job_id": 1, "hdr.ipv4.srcAddr": 7},
                            "MyIngress.set_member", {"worker": 0, "port": 1})


@case("INVALID_ARGUMENT")
def match_field_twice(conn):
    e = agg(conn)
    e.match.add().CopyFrom(e.match[0])
    return [upd(U.INSERT, e)]


@case("INVALID_ARGUMENT")
def match_field_twice_other_value(conn):
    e = agg(conn)
    m = e.match.add()
    m.CopyFrom(e.match[0])
    m.exact.value = b"\x09"
    return [upd(U.INSERT, e)]


@case("INVALID_ARGUMENT")
def param_twice(conn):
    e = route(conn)
    e.action.action.params.add().CopyFrom(e.action.action.params[0])
    return [upd(U.INSERT, e)]


@case("INVALID_ARGUMENT")
def param_twice_other_value(conn):
    e = route(conn)
    p = e.action.action.params.add()
    p.CopyFrom(e.action.action.params[0])
    p.value = b"\x02"
    return [upd(U.INSERT, e)]


@case("INVALID_ARGUMENT", bmv2="OK")
def empty_exact_value(conn):
    e = agg(conn)
    e.match[0].exact.value = b""
    return [upd(U.INSERT, e)]


@case("INVALID_ARGUMENT")
def priority_on_exact(conn):
    e = agg(conn)
    e.priority = 10
    return [upd(U.INSERT, e)]


@case("INVALID_ARGUMENT", bmv2="OK")
def negative_priority_on_exact(conn):
    e = agg(conn)
    e.priority = -1
    return [upd(U.INSERT, e)]


@case("INVALID_ARGUMENT")
def priority_on_lpm(conn):
    e = route(conn)
    e.priority = 10
    return [upd(U.INSERT, e)]


@case("INVALID_ARGUMENT")
def unknown_match_field_id(conn):
    e = agg(conn)
    m = e.match.add(field_id=9)
    m.exact.value = b"\x01"
    return [upd(U.INSERT, e)]


@case("INVALID_ARGUMENT")
def missing_exact_field(conn):
    e = member(conn)
    del e.match[1]
    return [upd(U.INSERT, e)]


@case("INVALID_ARGUMENT")
def exact_wider_than_field(conn):
    e = member(conn)
    e.match[0].exact.value = b"\x01\x00\x00"  # job_id is bit<16>
    return [upd(U.INSERT, e)]


@case("OK")
def exact_zero_padded(conn):
    e = member(conn)
    e.match[0].exact.value = b"\x00\x00\x00\x01"  # 1, padded beyond bit<16>
    return [upd(U.INSERT, e)]


@case("OK")
def exact_zero_padded_in_width(conn):
    e = member(conn)
    e.match[0].exact.value = b"\x00\x01"
    return [upd(U.INSERT, e)]


@case("INVALID_ARGUMENT")
def exact_as_lpm(conn):
    e = agg(conn)
    e.match[0].ClearField("exact")
    e.match[0].lpm.value = b"\x05"
    e.match[0].lpm.prefix_len = 32
    return [upd(U.INSERT, e)]


@case("INVALID_ARGUMENT")
def match_kind_unset(conn):
    e = agg(conn)
    e.match[0].ClearField("exact")
    return [upd(U.INSERT, e)]


@case("INVALID_ARGUMENT")
def lpm_prefix_zero_given(conn):
    e = route(conn)
    e.match[0].lpm.value = b"\x00"
    e.match[0].lpm.prefix_len = 0
    return [upd(U.INSERT, e)]


@case("INVALID_ARGUMENT")
def lpm_prefix_too_long(conn):
    e = route(conn)
    e.match[0].lpm.prefix_len = 33
    return [upd(U.INSERT, e)]


@case("INVALID_ARGUMENT")
def lpm_bits_beyond_prefix(conn):
    e = route(conn)
    e.match[0].lpm.value = b"\x0a\x00\x00\x01"
    return [upd(U.INSERT, e)]


@case("INVALID_ARGUMENT", bmv2="OK")
def lpm_empty_value(conn):
    e = route(conn)
    e.match[0].lpm.value = b""
    return [upd(U.INSERT, e)]


@case("INVALID_ARGUMENT")
def lpm_as_exact(conn):
    e = route(conn)
    e.match[0].ClearField("lpm")
    e.match[0].exact.value = b"\x0a\x00\x00\x00"
    return [upd(U.INSERT, e)]


@case("INVALID_ARGUMENT")
def param_too_wide(conn):
    e = route(conn)
    e.action.action.params[0].value = b"\x02\x00"  # port is bit<9>
    return [upd(U.INSERT, e)]


@case("OK")
def param_zero_padded(conn):
    e = route(conn)
    e.action.action.params[0].value = b"\x00\x00\x01"
    return [upd(U.INSERT, e)]


@case("INVALID_ARGUMENT", bmv2="OK")
def param_empty(conn):
    e = route(conn)
    e.action.action.params[0].value = b""
    return [upd(U.INSERT, e)]


@case("INVALID_ARGUMENT")
def param_missing(conn):
    e = route(conn)
    del e.action.action.params[0]
    return [upd(U.INSERT, e)]


@case("INVALID_ARGUMENT")
def param_unknown_id(conn):
    e = route(conn)
    e.action.action.params.add(param_id=9, value=b"\x01")
    return [upd(U.INSERT, e)]


@case("INVALID_ARGUMENT")
def unknown_action(conn):
    e = agg(conn)
    e.action.action.action_id = 0x01FFFFFF
    return [upd(U.INSERT, e)]


@case("INVALID_ARGUMENT")
def action_of_another_table(conn):
    e = agg(conn)
    e.action.action.CopyFrom(route(conn).action.action)
    return [upd(U.INSERT, e)]


@case("INVALID_ARGUMENT")
def action_unset(conn):
    e = agg(conn)
    e.ClearField("action")
    return [upd(U.INSERT, e)]


@case("INVALID_ARGUMENT")
def action_profile_member_on_direct_table(conn):
    e = agg(conn)
    e.action.action_profile_member_id = 1
    return [upd(U.INSERT, e)]


@case("INVALID_ARGUMENT")
def unknown_table(conn):
    e = agg(conn)
    e.table_id = 0x02FFFFFF
    return [upd(U.INSERT, e)]


@case("INVALID_ARGUMENT")
def table_id_zero(conn):
    e = agg(conn)
    e.table_id = 0
    return [upd(U.INSERT, e)]


@case("INVALID_ARGUMENT", bmv2="OK")
def is_const_set(conn):
    e = agg(conn)
    e.is_const = True
    return [upd(U.INSERT, e)]


@case("INVALID_ARGUMENT")
def idle_timeout_on_table_without(conn):
    e = agg(conn)
    e.idle_timeout_ns = 1000000000
    return [upd(U.INSERT, e)]


@case("INVALID_ARGUMENT")
def update_type_unspecified(conn):
    return [upd(U.UNSPECIFIED, agg(conn))]


@case("ALREADY_EXISTS")
def insert_existing(conn):
    conn.insert(AGG, {"hdr.ipv4.dstAddr": 5}, "MyIngress.accept_qaina")
    return [upd(U.INSERT, agg(conn))]


@case("NOT_FOUND")
def modify_missing(conn):
    return [upd(U.MODIFY, agg(conn))]


@case("NOT_FOUND")
def delete_missing(conn):
    return [upd(U.DELETE, agg(conn))]


@case("OK", bmv2="INVALID_ARGUMENT")
def modify_without_action(conn):
    conn.insert(AGG, {"hdr.ipv4.dstAddr": 5}, "MyIngress.accept_qaina")
    e = agg(conn)
    e.ClearField("action")
    return [upd(U.MODIFY, e)]


@case("OK")
def delete_ignores_the_action(conn):
    conn.insert(LPM, {"hdr.ipv4.dstAddr": (0x0A000000, 8)}, "MyIngress.forward", {"port": 1})
    e = route(conn)
    e.action.action.params[0].value = b"\x7f\x7f"  # nonsense, and ignored
    return [upd(U.DELETE, e)]


@case("INVALID_ARGUMENT")
def delete_with_match_field_twice(conn):
    conn.insert(AGG, {"hdr.ipv4.dstAddr": 5}, "MyIngress.accept_qaina")
    e = agg(conn)
    e.match.add().CopyFrom(e.match[0])
    return [upd(U.DELETE, e)]


@case("RESOURCE_EXHAUSTED", bmv2="UNKNOWN")
def table_full(conn):
    conn.insert_many([(AGG, {"hdr.ipv4.dstAddr": a}, "MyIngress.accept_qaina", {})
                      for a in range(100, 116)])
    return [upd(U.INSERT, agg(conn))]


@case("INVALID_ARGUMENT")
def insert_default(conn):
    e = conn.table_entry(AGG, {}, "NoAction", default=True)
    return [upd(U.INSERT, e)]


@case("INVALID_ARGUMENT")
def delete_default(conn):
    e = conn.table_entry(AGG, {}, "NoAction", default=True)
    return [upd(U.DELETE, e)]


@case("OK")
def modify_default(conn):
    e = conn.table_entry(LPM, {}, "MyIngress.forward", {"port": 3}, default=True)
    return [upd(U.MODIFY, e)]


@case("INVALID_ARGUMENT")
def modify_default_with_match(conn):
    e = conn.table_entry(AGG, {"hdr.ipv4.dstAddr": 5}, "NoAction", default=True)
    return [upd(U.MODIFY, e)]


@case("INVALID_ARGUMENT")
def modify_default_with_priority(conn):
    e = conn.table_entry(AGG, {}, "NoAction", default=True)
    e.priority = 3
    return [upd(U.MODIFY, e)]


@case("OK")
def modify_default_without_action(conn):
    e = conn.table_entry(AGG, {}, "NoAction", default=True)
    e.ClearField("action")
    return [upd(U.MODIFY, e)]


@case("INVALID_ARGUMENT")
def modify_default_foreign_action(conn):
    e = conn.table_entry(AGG, {}, "MyIngress.no_route", default=True)
    return [upd(U.MODIFY, e)]
