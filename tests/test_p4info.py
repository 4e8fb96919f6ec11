"""qaina.p4 and the committed qaina.p4info.txtpb describe the same program.

The source is scanned for every table, action, counter and register with its @id,
widths and sizes, and compared with the P4Info both ways. Where p4c is installed,
the program is compiled and p4c's P4Info is compared with the committed one.
"""

from __future__ import annotations

import re
import shutil

import pytest
from google.protobuf import text_format
from p4.config.v1 import p4info_pb2

from qaina_bench.harness import jobs
from qaina_bench.harness.targets import compile_p4
from qaina_bench.p4 import header
from qaina_bench.p4.embedded import pipeline
from qaina_bench.p4.p4info import P4_SOURCE, P4INFO_PATH, P4Info

SOURCE = P4_SOURCE.read_text()
PREFIX = {"action": 0x01, "table": 0x02, "counter": 0x12, "register": 0x16}
NOACTION_ID = 21257015  # p4c's id for core.p4's NoAction
STANDARD_METADATA = {"egress_rid": 16, "ingress_port": 9, "egress_port": 9}


def defines() -> dict[str, int]:
    return {k: int(v, 0) for k, v in re.findall(r"#define\s+(\w+)\s+(\d+)", SOURCE)}


def consts() -> dict[str, int]:
    return {k: int(v, 0) for k, v in
            re.findall(r"const\s+bit<\d+>\s+(\w+)\s*=\s*(0x[0-9a-fA-F]+|\d+)\s*;", SOURCE)}


def typedefs() -> dict[str, int]:
    return {k: int(w) for w, k in re.findall(r"typedef\s+bit<(\d+)>\s+(\w+)\s*;", SOURCE)}


def width(type_name: str) -> int:
    m = re.fullmatch(r"bit<(\d+)>", type_name.strip())
    return int(m.group(1)) if m else typedefs()[type_name.strip()]


def header_fields() -> dict[str, dict[str, int]]:
    """{header type: {field: width}}; struct headers_t maps instance names to types."""
    types = {}
    for name, body in re.findall(r"header\s+(\w+)\s*\{(.*?)\}", SOURCE, re.S):
        body = re.sub(r"//[^\n]*|/\*.*?\*/", "", body, flags=re.S)
        types[name] = {f: width(t) for t, f in re.findall(r"(bit<\d+>|\w+)\s+(\w+)\s*;", body)}
    inst = re.search(r"struct\s+headers_t\s*\{(.*?)\}", SOURCE, re.S).group(1)
    return {f: types[t] for t, f in re.findall(r"(\w+)\s+(\w+)\s*;", inst)}


def field_width(expr: str) -> int:
    parts = expr.split(".")
    if parts[0] == "hdr":
        return header_fields()[parts[1]][parts[2]]
    if parts[0] == "standard_metadata":
        return STANDARD_METADATA[parts[1]]
    raise AssertionError(f"unknown match field {expr}")


def size(expr: str) -> int:
    expr = expr.strip()
    return int(expr) if expr.isdigit() else defines()[expr]


def controls():
    """(control name, body) of every control block."""
    starts = [(m.group(1), m.end()) for m in re.finditer(r"control\s+(\w+)\s*\(", SOURCE)]
    for i, (name, start) in enumerate(starts):
        end = starts[i + 1][1] if i + 1 < len(starts) else len(SOURCE)
        yield name, SOURCE[start:end]


def scan_source():
    """Everything the control plane sees, as the P4 source declares it."""
    found = {"table": {}, "action": {}, "counter": {}, "register": {}}
    for ctl, body in controls():
        for pid, name, params in re.findall(r"@id\((\d+)\)\s*action\s+(\w+)\s*\(([^)]*)\)", body):
            plist = []
            for p in filter(None, (x.strip() for x in params.split(","))):
                t, pname = p.rsplit(None, 1)
                plist.append((pname, width(t)))
            found["action"][f"{ctl}.{name}"] = (PREFIX["action"] << 24 | int(pid), plist)
        for tid, name, tbody in re.findall(r"@id\((\d+)\)\s*table\s+(\w+)\s*\{(.*?)\n    \}",
                                           body, re.S):
            keys = re.search(r"key\s*=\s*\{(.*?)\}", tbody, re.S).group(1)
            mfs = [(f, field_width(f), mt.upper())
                   for f, mt in re.findall(r"([\w.]+)\s*:\s*(\w+)\s*;", keys)]
            acts = re.search(r"actions\s*=\s*\{(.*?)\}", tbody, re.S).group(1)
            acts = [a.strip() for a in acts.split(";") if a.strip()]
            tsize = size(re.search(r"size\s*=\s*(\w+)\s*;", tbody).group(1))
            found["table"][f"{ctl}.{name}"] = (PREFIX["table"] << 24 | int(tid), mfs, acts, tsize)
        for cid, csize, name in re.findall(
                r"@id\((\d+)\)\s*counter\((\w+),\s*CounterType\.\w+\)\s*(\w+)\s*;", body):
            found["counter"][f"{ctl}.{name}"] = (PREFIX["counter"] << 24 | int(cid), size(csize))
        for rid, w, rsize, name in re.findall(
                r"@id\((\d+)\)\s*register<bit<(\d+)>>\((\w+)\)\s*(\w+)\s*;", body):
            found["register"][f"{ctl}.{name}"] = (PREFIX["register"] << 24 | int(rid),
                                                  int(w), size(rsize))
    return found


INFO = P4Info.load()
SRC = scan_source()


def test_source_scan_finds_the_program():
    assert len(SRC["table"]) == 5 and len(SRC["counter"]) == 6 and len(SRC["register"]) == 4


def test_every_table_agrees():
    assert set(SRC["table"]) == {t.name for t in INFO.tables.values()}
    for name, (tid, mfs, acts, tsize) in SRC["table"].items():
        t = INFO.table(name)
        assert t.id == tid, name
        assert [(m.name, m.bitwidth, m.match_type) for m in t.match_fields] == mfs, name
        assert t.size == tsize, name
        ref_names = [INFO.action(a).name.split(".")[-1] for a in t.action_ids]
        assert ref_names == acts, name


def test_every_action_agrees():
    info_actions = {a.name for a in INFO.actions.values()} - {"NoAction"}
    assert set(SRC["action"]) == info_actions
    assert INFO.action("NoAction").id == NOACTION_ID
    for name, (aid, params) in SRC["action"].items():
        a = INFO.action(name)
        assert a.id == aid, name
        assert [(p.name, p.bitwidth) for p in a.params] == params, name
        assert [p.id for p in a.params] == list(range(1, len(params) + 1))


def test_every_counter_and_register_agrees():
    assert set(SRC["counter"]) == {c.name for c in INFO.counters.values()}
    for name, (cid, csize) in SRC["counter"].items():
        c = INFO.counter(name)
        assert (c.id, c.size) == (cid, csize), name
    assert set(SRC["register"]) == {r.name for r in INFO.registers.values()}
    for name, (rid, w, rsize) in SRC["register"].items():
        r = INFO.register(name)
        assert (r.id, r.bitwidth, r.size) == (rid, w, rsize), name


def test_constants_agree_with_the_python_side():
    c, d = consts(), defines()
    assert c["QAINA_UDP_PORT"] == header.QAINA_UDP_PORT
    assert c["QAINA_UDP_LEN"] == header.UDP_TOTAL_LEN
    assert c["QAINA_IPV4_LEN"] == header.IPV4_TOTAL_LEN
    assert c["FLAG_RESULT"] == header.FLAG_RESULT and c["FLAG_RETX"] == header.FLAG_RETX
    assert c["RESULT_TTL"] == pipeline.RESULT_TTL
    assert d["QAINA_WORDS"] == header.QAINA_WORDS
    assert d["POOL_SLOTS"] == jobs.POOL_SLOTS and d["MAX_JOBS"] == jobs.MAX_JOBS
    assert d["POOL_COPIES"] == 2 * d["POOL_SLOTS"]
    assert d["POOL_WORDS"] == d["POOL_COPIES"] * d["QAINA_WORDS"]
    reasons = {k[5:].lower(): v for k, v in c.items() if k.startswith("DROP_")}
    assert reasons == {name: index for index, name in pipeline.DROP_REASONS.items()}
    assert max(reasons.values()) < d["DROP_REASONS"]


def semantic(info: p4info_pb2.P4Info) -> dict:
    """What must match between two P4Infos (p4c versions differ in annotations)."""
    return {
        "arch": info.pkg_info.arch,
        "tables": sorted((t.preamble.id, t.preamble.name, t.size,
                          tuple((m.id, m.name, m.bitwidth, m.match_type) for m in t.match_fields),
                          tuple(sorted(r.id for r in t.action_refs))) for t in info.tables),
        "actions": sorted((a.preamble.id, a.preamble.name,
                           tuple((p.id, p.name, p.bitwidth) for p in a.params))
                          for a in info.actions),
        "counters": sorted((c.preamble.id, c.preamble.name, c.spec.unit, c.size)
                           for c in info.counters),
        "registers": sorted((r.preamble.id, r.preamble.name, r.size,
                             r.type_spec.bitstring.bit.bitwidth) for r in info.registers),
    }


@pytest.mark.skipif(shutil.which("p4c") is None,
                    reason="p4c not on PATH (BMv2/p4c come from the Vagrant VM or a P4 "
                           "toolchain install); the source/P4Info scan above still ran")
def test_p4c_emits_the_committed_p4info(tmp_path):
    _, info_path = compile_p4(cache=tmp_path)
    generated = p4info_pb2.P4Info()
    text_format.Parse(info_path.read_text(), generated)
    committed = p4info_pb2.P4Info()
    text_format.Parse(P4INFO_PATH.read_text(), committed)
    assert semantic(generated) == semantic(committed)
