"""What the parts of a P4Runtime Write update mean, checked the way the P4Runtime
specification (1.4.1, "Table Entry", "Bytestrings", "Counter Entry", "Multicast
Group Entry") says; a violation raises ``PipelineError`` with the spec's code.

Where BMv2's ``simple_switch_grpc`` answers otherwise, this follows the spec; the
differences are listed in p4/README.md ("P4Runtime servers") and pinned by
tests/test_p4runtime_write.py.
"""

from __future__ import annotations

from ..p4info import ActionInfo, TableInfo
from .tables import PipelineError

#: v1model's widths: ``egress_rid`` (a replica's instance) and ``egress_spec`` (a port)
INSTANCE_BITS = 16
#: replicas of one multicast group, the width of a group id (v1model's ``mcast_grp``),
#: and replicas of all groups together: a copy of a result per replica (a job's group
#: has one per worker, 32 at most), and memory per replica
MAX_REPLICAS = 4096
GROUP_BITS = 16
MAX_ALL_REPLICAS = 65536
PORT_BITS = 9


def invalid(message: str) -> PipelineError:
    return PipelineError("INVALID_ARGUMENT", message)


def bytestring(data: bytes, bitwidth: int, what: str) -> int:
    """A P4Runtime bytestring as an int: never empty, zero padding allowed, the value
    within ``bitwidth`` bits."""
    if not data:
        raise invalid(f"{what}: an empty bytestring is no value")
    value = int.from_bytes(data, "big")
    if value >> bitwidth:
        raise invalid(f"{what}: 0x{data.hex()} does not fit in {bitwidth} bits")
    return value


def match_key(table: TableInfo, entry) -> tuple:
    """The key of ``entry`` in ``table``: an int per exact field, ``(value, prefix_len)``
    per LPM field (``(0, 0)`` when omitted, its only "don't care" form)."""
    given = {}
    for m in entry.match:
        if m.field_id in given:
            raise invalid(f"{table.name}: match field id {m.field_id} given twice")
        given[m.field_id] = m
    key = []
    for mf in table.match_fields:
        m = given.pop(mf.id, None)
        kind = m.WhichOneof("field_match_type") if m is not None else None
        if mf.match_type == "LPM":
            if m is None:
                key.append((0, 0))
                continue
            if kind != "lpm":
                raise invalid(f"{mf.name} is an LPM field, given {kind or 'no match kind'}")
            value = bytestring(m.lpm.value, mf.bitwidth, mf.name)
            plen = m.lpm.prefix_len
            if plen == 0:
                raise invalid(f"{mf.name}: a /0 prefix is expressed by omitting the field")
            if not 0 < plen <= mf.bitwidth:
                raise invalid(f"{mf.name}: prefix length {plen} exceeds {mf.bitwidth}")
            if value & ((1 << (mf.bitwidth - plen)) - 1):
                raise invalid(f"{mf.name}: bits beyond the /{plen} prefix are set")
            key.append((value, plen))
        elif mf.match_type != "EXACT":
            raise PipelineError("UNIMPLEMENTED", f"{mf.name}: {mf.match_type} matches "
                                "are not supported")
        else:
            if m is None:
                raise invalid(f"{table.name}: exact field {mf.name} missing")
            if kind != "exact":
                raise invalid(f"{mf.name} is an exact field, given {kind or 'no match kind'}")
            key.append(bytestring(m.exact.value, mf.bitwidth, mf.name))
    if given:
        raise invalid(f"{table.name} has no match field ids {sorted(given)}")
    return tuple(key)


PRIORITY_MATCHES = ("TERNARY", "RANGE", "OPTIONAL")


def check_entry(table: TableInfo, entry):
    """The priority (positive with a ternary, range or optional field, else 0) and
    what a table of ``qaina.p4`` has not: direct counters or meters, idle timeout."""
    if any(mf.match_type in PRIORITY_MATCHES for mf in table.match_fields):
        if entry.priority <= 0 and not entry.is_default_action:
            raise invalid(f"{table.name}: a positive priority is needed")
    elif entry.priority != 0:
        raise invalid(f"{table.name}: priority {entry.priority} given, but the table has "
                      "no ternary, range or optional field")
    if entry.is_const:
        raise invalid(f"{table.name}: is_const must be false in a write")
    if entry.idle_timeout_ns:
        raise invalid(f"{table.name} has no idle timeout (idle_timeout_ns must be 0)")
    if entry.HasField("meter_config"):
        raise invalid(f"{table.name} has no direct meter")
    if entry.HasField("counter_data"):
        raise invalid(f"{table.name} has no direct counter")


def table_action(table: TableInfo, actions: dict[int, ActionInfo], entry):
    """``(action_id, params)`` of the direct action of ``entry``, params in P4Info
    order; ``None`` when the entry has no action."""
    kind = entry.action.WhichOneof("type")
    if kind is None:
        return None
    if kind != "action":
        raise invalid(f"{table.name} is a direct table: {kind} cannot be used")
    a = entry.action.action
    info = actions.get(a.action_id) if a.action_id in table.action_ids else None
    if info is None:
        raise invalid(f"action id {a.action_id} is not an action of {table.name}")
    given = {}
    for p in a.params:
        if p.param_id in given:
            raise invalid(f"{info.name}: parameter id {p.param_id} given twice")
        given[p.param_id] = p.value
    params = []
    for p in info.params:
        if p.id not in given:
            raise invalid(f"{info.name}: parameter {p.name} missing")
        params.append(bytestring(given.pop(p.id), p.bitwidth, f"{info.name}.{p.name}"))
    if given:
        raise invalid(f"{info.name} has no parameter ids {sorted(given)}")
    return a.action_id, tuple(params)


def replicas(group) -> list[tuple[int, int]]:
    """The ``(port, instance)`` pairs of a multicast group entry: ports and instances
    within v1model's widths, no pair twice, no backup replicas."""
    if len(group.replicas) > MAX_REPLICAS:
        raise PipelineError("RESOURCE_EXHAUSTED", f"multicast group {group.multicast_group_id}: "
                            f"{len(group.replicas)} replicas; at most {MAX_REPLICAS}")
    out, seen = [], set()
    for r in group.replicas:
        if len(r.backup_replicas):
            raise PipelineError("UNIMPLEMENTED", "backup replicas are not supported")
        port = bytestring(r.port, 32, "replica port") if r.port else r.egress_port
        if port >> PORT_BITS:
            raise invalid(f"multicast group {group.multicast_group_id}: port {port} is no "
                          f"port of this switch (ports are {PORT_BITS} bits)")
        if r.instance >> INSTANCE_BITS:
            raise invalid(f"multicast group {group.multicast_group_id}: instance "
                          f"{r.instance} exceeds {INSTANCE_BITS} bits")
        if (port, r.instance) in seen:
            raise invalid(f"multicast group {group.multicast_group_id}: replica "
                          f"(port {port}, instance {r.instance}) given twice")
        seen.add((port, r.instance))
        out.append((port, r.instance))
    return out
