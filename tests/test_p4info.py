"""qaina.p4, its committed P4Info and the Python side agree.

The committed ``qaina.p4info.txtpb`` is p4c's output (``make p4info`` regenerates
it); where p4c is installed it is compared in full with a fresh compile. The
program's constants are compared with ``p4/constants.py`` and ``p4/header.py``.
"""

from __future__ import annotations

import difflib
import re
import shutil
from pathlib import Path

import pytest

from qaina_bench.harness.switches.targets import compile_p4
from qaina_bench.p4 import constants, header, program
from qaina_bench.p4.p4info import P4_SOURCE, P4INFO_PATH, P4Info
from qaina_bench.p4.proto import p4info_pb2, text_format

SOURCE = P4_SOURCE.read_text()


def defines(text: str = SOURCE) -> dict[str, int]:
    return {k: int(v, 0) for k, v in re.findall(r"#define\s+(\w+)\s+(\d+)", text)}


def consts(text: str = SOURCE) -> dict[str, int]:
    return {k: int(v, 0) for k, v in
            re.findall(r"const\s+bit<\d+>\s+(\w+)\s*=\s*(0x[0-9a-fA-F]+|\d+)\s*;", text)}


def test_constants_agree_with_the_python_side():
    c, d = consts(), defines()
    assert c["QAINA_UDP_PORT"] == header.QAINA_UDP_PORT
    assert c["QAINA_UDP_LEN"] == header.UDP_TOTAL_LEN
    assert c["QAINA_IPV4_LEN"] == header.IPV4_TOTAL_LEN
    assert c["FLAG_RESULT"] == header.FLAG_RESULT and c["FLAG_RETX"] == header.FLAG_RETX
    assert c["FLAG_FALLBACK"] == header.FLAG_FALLBACK
    assert c["RESULT_TTL"] == constants.RESULT_TTL
    assert d["QAINA_WORDS"] == header.QAINA_WORDS
    for name in ("POOL_SLOTS", "POOL_COPIES", "POOL_WORDS", "MAX_JOBS", "MAX_WORKERS",
                 "DROP_REASONS"):
        assert d[name] == getattr(constants, name), name
    reasons = {k[5:]: v for k, v in c.items() if k.startswith("DROP_")}
    assert reasons == {d.name: int(d) for d in constants.Drop}
    assert max(reasons.values()) < d["DROP_REASONS"]


def test_the_p4info_sizes_are_the_constants():
    info = P4Info.load()
    assert info.register("agg_sum").size == constants.POOL_WORDS
    for name in ("agg_seen", "agg_count", "agg_exp"):
        assert info.register(name).size == constants.POOL_COPIES
    assert info.table("job_table").size == constants.MAX_JOBS
    assert info.counter("drops").size == constants.DROP_REASONS
    for name in ("slots_opened", "slots_closed", "agg_packets", "retx_answered", "results_sent",
                 "fallback_packets"):
        assert info.counter(name).size == constants.MAX_JOBS
    assert info.register("agg_seen").bitwidth == constants.MAX_WORKERS


@pytest.mark.skipif(shutil.which("p4c") is None,
                    reason="p4c not on PATH (BMv2/p4c come from the Vagrant VM or a P4 "
                           "toolchain install); the committed P4Info is p4c's output")
def test_p4c_emits_the_committed_p4info(tmp_path):
    _, info_path = compile_p4(cache=tmp_path)
    generated = p4info_pb2.P4Info()
    text_format.Parse(info_path.read_text(), generated)
    committed = p4info_pb2.P4Info()
    text_format.Parse(P4INFO_PATH.read_text(), committed)
    if generated != committed:
        diff = difflib.unified_diff(text_format.MessageToString(committed).splitlines(),
                                    text_format.MessageToString(generated).splitlines(),
                                    "committed", "p4c", lineterm="", n=2)
        pytest.fail("p4c's P4Info differs from p4/qaina.p4info.txtpb (run `make p4info`):\n"
                    + "\n".join(list(diff)[:80]))


def test_qaina_p4_is_the_32_word_build():
    assert program.source(32) == SOURCE
    assert program.p4info(32).proto == P4Info.load().proto


@pytest.mark.parametrize("words", header.PAYLOAD_WORDS)
def test_each_build_differs_only_in_its_payload(words):
    text, w = program.source(words), header.wire(words)
    d, c = defines(text), consts(text)
    assert d["QAINA_WORDS"] == words
    assert d["POOL_WORDS"] == constants.POOL_COPIES * words
    assert (c["QAINA_UDP_LEN"], c["QAINA_IPV4_LEN"]) == (w.udp_len, w.ipv4_len)
    assert header.p4_header_fields(text, "payload_h") == [(f"w{i}", 32) for i in range(words)]
    macro = re.search(r"#define ALL_WORDS\(OP\)((?:.*\\\n)*.*)", text).group(1)
    assert [int(i) for i in re.findall(r"OP\((\d+)\)", macro)] == list(range(words))
    changed = [line for line in difflib.unified_diff(SOURCE.splitlines(), text.splitlines(),
                                                     lineterm="", n=0)
               if line[:1] in "+-" and line[:3] not in ("+++", "---")]
    allowed = re.compile(r"^[-+](#define (QAINA|POOL)_WORDS|const bit<16> QAINA_(UDP|IPV4)_LEN"
                         r"|    bit<32> w\d+;|    OP\(\d+\))")
    assert all(allowed.match(line) for line in changed), changed[:5]
    sizes = {r.name: r.size for r in program.p4info(words).registers.values()}
    assert sizes["MyIngress.agg_sum"] == constants.POOL_COPIES * words
    assert program.words_of(program.p4info(words)) == words


@pytest.mark.skipif(shutil.which("p4c") is None,
                    reason="p4c not on PATH (BMv2/p4c come from the Vagrant VM or a P4 "
                           "toolchain install)")
@pytest.mark.parametrize("words", header.PAYLOAD_WORDS)
def test_p4c_emits_each_builds_p4info(words, tmp_path):
    _, info_path = compile_p4(words, cache=tmp_path)
    generated = p4info_pb2.P4Info()
    text_format.Parse(info_path.read_text(), generated)
    assert generated == program.p4info(words).proto


def test_only_p4_proto_names_the_protobuf_provider():
    """Every P4Runtime message and stub comes through p4/proto.py, so the package that
    provides the generated code is named there alone (tests/shell_client.py runs in
    p4runtime-shell's own venv and is not the project's)."""
    import ast
    root = P4_SOURCE.parent.parent
    foreign = ("finsy", "p4.v1", "p4.config", "google.rpc")
    offenders = []
    for path in root.rglob("*.py"):
        rel = path.relative_to(root)
        if rel.parts[0].startswith(".") or rel in (Path("p4/proto.py"),
                                                   Path("tests/shell_client.py")):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) and
                     not node.level else [])
            offenders += [f"{rel}: {n}" for n in names
                          if any(n == f or n.startswith(f + ".") for f in foreign)]
    assert offenders == []


def test_the_control_plane_runs_on_a_compiled_protobuf_runtime():
    from qaina_bench.p4.proto import implementation
    assert implementation() in ("upb", "cpp")
