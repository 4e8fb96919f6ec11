"""The P4Info of ``qaina.p4``: the single source of table, action, counter and
register names and ids, for the control plane and the embedded switch alike."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .proto import p4info_pb2, text_format

P4_DIR = Path(__file__).resolve().parent
P4_SOURCE = P4_DIR / "qaina.p4"
P4INFO_PATH = P4_DIR / "qaina.p4info.txtpb"

MATCH_TYPES = {v: k for k, v in p4info_pb2.MatchField.MatchType.items()}


@dataclass(frozen=True)
class MatchFieldInfo:
    id: int
    name: str
    bitwidth: int
    match_type: str  # "EXACT", "LPM", ...


@dataclass(frozen=True)
class ParamInfo:
    id: int
    name: str
    bitwidth: int


@dataclass(frozen=True)
class ActionInfo:
    id: int
    name: str
    params: tuple[ParamInfo, ...]

    def param(self, name: str) -> ParamInfo:
        for p in self.params:
            if p.name == name:
                return p
        raise KeyError(f"action {self.name} has no parameter {name}")


@dataclass(frozen=True)
class TableInfo:
    id: int
    name: str
    match_fields: tuple[MatchFieldInfo, ...]
    action_ids: tuple[int, ...]
    size: int
    default_action_id: int | None = None  # the P4Info's initial_default_action

    def match_field(self, name: str) -> MatchFieldInfo:
        for m in self.match_fields:
            if m.name == name or m.name.split(".")[-1] == name:
                return m
        raise KeyError(f"table {self.name} has no match field {name}")


@dataclass(frozen=True)
class ArrayInfo:
    """A counter or register array."""

    id: int
    name: str
    size: int
    bitwidth: int | None = None  # registers only


class P4Info:
    """Lookup of P4 entities by full name (``MyIngress.job_table``), alias or id."""

    def __init__(self, proto: p4info_pb2.P4Info):
        self.proto = proto
        self.actions = {a.preamble.id: ActionInfo(
            a.preamble.id, a.preamble.name,
            tuple(ParamInfo(p.id, p.name, p.bitwidth) for p in a.params))
            for a in proto.actions}
        self.tables = {t.preamble.id: TableInfo(
            t.preamble.id, t.preamble.name,
            tuple(MatchFieldInfo(m.id, m.name, m.bitwidth, MATCH_TYPES[m.match_type])
                  for m in t.match_fields),
            tuple(r.id for r in t.action_refs), t.size,
            t.initial_default_action.action_id if t.HasField("initial_default_action") else None)
            for t in proto.tables}
        self.counters = {c.preamble.id: ArrayInfo(c.preamble.id, c.preamble.name, c.size)
                         for c in proto.counters}
        self.registers = {r.preamble.id: ArrayInfo(
            r.preamble.id, r.preamble.name, r.size, r.type_spec.bitstring.bit.bitwidth)
            for r in proto.registers}
        self._by_name = {}
        for kind in ("actions", "tables", "counters", "registers"):
            for obj in getattr(self, kind).values():
                self._by_name[kind, obj.name] = obj
                self._by_name.setdefault((kind, obj.name.split(".")[-1]), obj)

    @classmethod
    def load(cls, path: str | Path = P4INFO_PATH) -> "P4Info":
        proto = p4info_pb2.P4Info()
        text_format.Parse(Path(path).read_text(), proto)
        return cls(proto)

    def _get(self, kind: str, key):
        if isinstance(key, int):
            return getattr(self, kind)[key]
        try:
            return self._by_name[kind, key]
        except KeyError:
            raise KeyError(f"the P4Info has no {kind[:-1]} named {key!r}") from None

    def table(self, key) -> TableInfo:
        return self._get("tables", key)

    def action(self, key) -> ActionInfo:
        return self._get("actions", key)

    def counter(self, key) -> ArrayInfo:
        return self._get("counters", key)

    def register(self, key) -> ArrayInfo:
        return self._get("registers", key)


def difference(expected: p4info_pb2.P4Info, given: p4info_pb2.P4Info) -> str | None:
    """None if ``given`` is ``expected``; else what differs first, in a few words."""
    if given == expected:
        return None
    for field, _ in expected.ListFields() + given.ListFields():
        mine, theirs = getattr(expected, field.name), getattr(given, field.name)
        if mine == theirs:
            continue
        entity = field.message_type
        if (field.label != field.LABEL_REPEATED or entity is None
                or "preamble" not in entity.fields_by_name):
            return f"{field.name} differs"
        ours = {e.preamble.name: e for e in mine}
        other = {e.preamble.name: e for e in theirs}
        for name in ours.keys() - other.keys():
            return f"{field.name} {name} is missing"
        for name in other.keys() - ours.keys():
            return f"{field.name} {name} is not in qaina.p4"
        for name in ours:
            if ours[name] != other[name]:
                return f"{field.name} {name} differs"
        return f"{field.name} are in another order"
    return "it differs"


def encode(value: int, bitwidth: int) -> bytes:
    """``value`` as a P4Runtime canonical bytestring (no leading zero bytes)."""
    if value < 0 or value >> bitwidth:
        raise ValueError(f"{value} does not fit in {bitwidth} bits")
    return value.to_bytes(max(1, (value.bit_length() + 7) // 8), "big")


def decode(data: bytes, bitwidth: int | None = None) -> int:
    """A P4Runtime bytestring (canonical or padded) as an int, checked against width."""
    value = int.from_bytes(data, "big")
    if bitwidth is not None and value >> bitwidth:
        raise ValueError(f"0x{data.hex()} does not fit in {bitwidth} bits")
    return value
