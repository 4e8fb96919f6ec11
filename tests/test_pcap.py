"""The QAINA Wireshark dissector (generated from p4/header.py) and the choice of what
``up --pcap`` captures, without a network: the dissector decodes frames scapy builds
from the same header definition, read back by the real tshark."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

import pytest

from qaina_bench.harness.config import RunConfig
from qaina_bench.harness.running.capture import CapturePlan, find_tool, topology_interfaces
from qaina_bench.harness.running.run import build_topology
from qaina_bench.p4.header import (QAINA_FIELDS, QAINA_FLAGS, QAINA_UDP_PORT, QAINA_WORDS,
                                   scapy_layer)
from qaina_bench.p4.wireshark import dissector_lua
from qaina_bench.settings import ConfigError

needs_tshark = pytest.mark.skipif(shutil.which("tshark") is None,
                                  reason="tshark missing: apt-get install tshark")
_KIND = {(8, False): "uint8", (8, True): "int8", (16, False): "uint16",
         (16, True): "int16", (32, False): "uint32", (32, True): "int32"}


def test_the_dissector_declares_every_field_and_flag_of_the_header():
    """Generated from QAINA_FIELDS and QAINA_FLAGS: a field or flag added there is in
    the dissector, with its width and signedness, so the two cannot drift."""
    lua = dissector_lua()
    for f in QAINA_FIELDS:
        assert re.search(rf'ProtoField\.{_KIND[f.bits, f.signed]}\("qaina\.{f.name}"', lua), f
        assert f"F.{f.name}" in lua.split("qaina.fields = {")[1].split("}")[0]
    for flag in QAINA_FLAGS:
        assert re.search(rf'ProtoField\.bool\("qaina\.flags\.{flag.name.lower()}", '
                         rf'"{flag.name}", 8, nil, 0x{flag.mask:02x}', lua), flag
    assert f'DissectorTable.get("udp.port"):add({QAINA_UDP_PORT}, qaina)' in lua
    assert '"qaina.word"' in lua


def tshark_fields(lua_path, pcap, fields: list[str], display_filter: str = "") -> list[list[str]]:
    """One row per frame: the values of ``fields`` as tshark prints them."""
    cmd = ["tshark", "-X", f"lua_script:{lua_path}", "-r", str(pcap), "-T", "fields",
           "-E", "separator=/t", "-E", "occurrence=a", "-E", "aggregator=,"]
    cmd += [x for f in fields for x in ("-e", f)]
    if display_filter:
        cmd += ["-Y", display_filter]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return [line.split("\t") for line in out.stdout.splitlines()]


@needs_tshark
def test_tshark_decodes_every_field_with_the_generated_dissector(tmp_path):
    from scapy.layers.inet import IP, UDP
    from scapy.layers.l2 import Ether
    from scapy.packet import Raw
    from scapy.utils import wrpcap
    qaina = scapy_layer()
    udp = UDP(sport=QAINA_UDP_PORT, dport=QAINA_UDP_PORT)
    frames = [
        Ether() / IP(src="10.0.0.1", dst="10.255.0.1") / udp /
        qaina(job_id=513, worker=7, flags=0x02, slot=1023, ver=1, exp=-9, seq=4_000_000_000,
              words=[(k * 2654435761) & 0xFFFFFFFF for k in range(QAINA_WORDS)]),
        Ether() / IP(src="10.255.0.1", dst="10.0.0.1") / udp /
        qaina(job_id=1, worker=255, flags=0x0D, slot=0, ver=0, exp=127, seq=0, words=[1] * 256),
        Ether() / IP() / UDP(sport=40000, dport=QAINA_UDP_PORT) / Raw(b"\x00" * 5),
        Ether() / IP() / UDP(sport=40000, dport=QAINA_UDP_PORT) / Raw(b"\x00" * 14),
    ]
    wrpcap(str(tmp_path / "q.pcap"), frames)
    (tmp_path / "qaina.lua").write_text(dissector_lua())
    names = [f.name for f in QAINA_FIELDS]
    flags = [f"qaina.flags.{f.name.lower()}" for f in QAINA_FLAGS]
    rows = tshark_fields(tmp_path / "qaina.lua", tmp_path / "q.pcap",
                         [f"qaina.{n}" for n in names] + flags
                         + ["qaina.words", "qaina.word", "_ws.malformed"])
    assert len(rows) == 4
    for row, frame in zip(rows[:2], frames[:2]):
        q = frame[qaina]
        got = dict(zip(names + flags + ["words", "word", "malformed"], row))
        for n in names:
            assert int(got[n], 0) == getattr(q, n), n
        for flag, key in zip(QAINA_FLAGS, flags):
            assert got[key] in ("1", "True") if q.flags.value & flag.mask else \
                got[key] in ("0", "False"), (key, got[key])
        assert int(got["words"]) == len(q.words)
        assert [int(w, 16) for w in got["word"].split(",")] == list(q.words)
        assert got["malformed"] == ""
    # shorter than the header, then a payload of 2 bytes past it: both malformed
    assert rows[2][-1] and rows[3][-1]


def test_a_node_stands_for_all_its_interfaces_and_names_keep_their_order():
    topo = build_topology(RunConfig.flat(topo="star", jobs=1, workers=3))
    assert topology_interfaces(topo)["s1"] == ["s1-eth1", "s1-eth2", "s1-eth3"]
    plan = CapturePlan.resolve("h2, s1-eth3,h2", topo, 8)
    assert plan.interfaces == {"h2-eth0": "h2", "s1-eth3": "s1"}
    plan = CapturePlan.resolve("s1", topo, 8)
    assert list(plan.interfaces) == ["s1-eth1", "s1-eth2", "s1-eth3"]


def test_an_unknown_name_is_refused_naming_the_valid_ones():
    topo = build_topology(RunConfig.flat(topo="dumbbell", jobs=1, workers=2))
    with pytest.raises(ConfigError) as exc:
        CapturePlan.resolve("h1,s3", topo, 8)
    msg = str(exc.value)
    assert "--pcap s3" in msg and "h1, h2, s1, s2" in msg and "s1-eth1" in msg
    assert "\n" not in msg
    with pytest.raises(ConfigError, match="give node or interface names"):
        CapturePlan.resolve(" , ", topo, 8)


def test_without_a_capture_tool_it_says_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # a PATH holding no program at all
    with pytest.raises(ConfigError, match=r"apt-get install tcpdump \(or tshark"):
        find_tool()


@pytest.mark.skipif(shutil.which("dumpcap") is None or shutil.which("tcpdump") is None,
                    reason="needs dumpcap and tcpdump: apt-get install tshark tcpdump")
def test_dumpcap_writes_pcapng_bounded_and_tcpdump_is_the_fallback(tmp_path, monkeypatch):
    topo = build_topology(RunConfig.flat(topo="star", jobs=1, workers=2))
    plan = CapturePlan.resolve("h1", topo, 3)
    assert plan.tool == "dumpcap" and plan.suffix == ".pcapng"
    cmd = plan.command("h1-eth0", tmp_path / "x.pcapng")
    assert cmd[cmd.index("-a") + 1] == "filesize:3000"  # kB of 1000 bytes
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "tcpdump").symlink_to(shutil.which("tcpdump"))
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    plan = CapturePlan.resolve("h1", topo, 3)
    assert plan.tool == "tcpdump" and plan.suffix == ".pcap"
    cmd = plan.command("h1-eth0", tmp_path / "x.pcap")
    assert cmd[cmd.index("-C") + 1] == "3" and cmd[cmd.index("-W") + 1] == "1"
    assert cmd[cmd.index("-Z") + 1] == "root"  # else it cannot write into a root's results


def test_the_pcap_size_must_be_a_positive_number_of_megabytes():
    with pytest.raises(ConfigError, match="--pcap-size 0"):
        RunConfig.flat(pcap="h1", pcap_size=0).check()


def test_the_dissector_command_writes_the_generated_lua(tmp_path):
    out = tmp_path / "q.lua"
    done = subprocess.run([sys.executable, "-m", "qaina_bench.harness.cli", "dissector",
                           "--out", str(out)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert out.read_text() == dissector_lua()
    printed = subprocess.run([sys.executable, "-m", "qaina_bench.harness.cli", "dissector"],
                             capture_output=True, text=True, timeout=60)
    assert printed.stdout == dissector_lua()
    bad = subprocess.run([sys.executable, "-m", "qaina_bench.harness.cli", "dissector",
                          "--out", str(tmp_path / "no" / "q.lua")],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and "Traceback" not in bad.stderr
    assert bad.stderr.strip().splitlines()[-1].startswith("Error: cannot write")


def test_a_servers_captures_helper_refuses_what_it_is_not_given_and_signals_only_its_tool(
        tmp_path):
    """``remote captures`` (run over ssh on a cluster's server): wrong arguments or
    captures are one line, exit 2; a PID that is not the capture tool is left alone."""
    helper = [sys.executable, "-m", "qaina_bench.harness.running.remote", "captures"]
    for args, stdin in ((["wait", "tcpdump", "x"], "[]"), (["stop", "tcpdump", "-1"], "[]"),
                        (["wait", "tcpdump", "5"], '[{"pid": "x"}]'),
                        (["wait", "tcpdump", "5"], "{bad"), (["stop"], "[]")):
        res = subprocess.run(helper + args, input=stdin, capture_output=True, text=True,
                             timeout=60)
        assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
        assert res.stderr.startswith("usage: captures"), res.stderr
    other = subprocess.Popen(["sleep", "60"])
    try:
        items = [{"pid": other.pid, "file": str(tmp_path / "x.pcap"),
                  "log": str(tmp_path / "x.log")}]
        res = subprocess.run(helper + ["stop", "tcpdump", "1"], input=json.dumps(items),
                             capture_output=True, text=True, timeout=60)
        assert res.returncode == 0 and other.poll() is None, res.stderr
    finally:
        other.kill()
        other.wait()
