"""``up --pcap`` on real runs, as root: the captures decode with tshark and the
generated dissector into exactly what the agents sent and received; the capture
processes are stopped and their files written out at the end of a run, on Ctrl-C and,
after a kill -9 of the CLI, by ``qaina-bench clean``."""

from __future__ import annotations

import csv
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from qaina_bench.harness.running import capture
from qaina_bench.harness.running.record import RunRecord, record_dir
from qaina_bench.hosts.lanes import LaneFormat
from qaina_bench.p4.header import FLAG_RESULT, FLAG_RETX, QAINA_FIELDS
from test_pcap import tshark_fields
from testbed_lab import execute, target  # noqa: F401  (the fixture)

pytestmark = [
    pytest.mark.root,  # Mininet
    pytest.mark.skipif(shutil.which("mnexec") is None,
                       reason="mnexec missing: apt-get install mininet"),
    pytest.mark.skipif(shutil.which("tshark") is None or shutil.which("dumpcap") is None,
                       reason="tshark missing: apt-get install tshark"),
]

NAMES = [f.name for f in QAINA_FIELDS]
FIELDS = ["ip.src", "ip.dst", "udp.length"] + [f"qaina.{n}" for n in NAMES] + [
    "qaina.words", "qaina.word", "_ws.malformed", "_ws.expert"]


def decode(directory, interface: str, suffix: str = ".pcapng") -> list[dict]:
    """Every UDP frame of an interface's capture, with its QAINA fields as numbers
    (not the ICMP errors a host sends for a late result to an agent that has ended:
    they quote the datagram)."""
    rows = tshark_fields(directory / "pcap" / "qaina.lua",
                         directory / "pcap" / f"{interface}{suffix}", FIELDS, "udp && !icmp")
    out = []
    for row in rows:
        d = dict(zip(FIELDS, row))
        assert d["_ws.malformed"] == "" and d["_ws.expert"] == "", d
        assert d["qaina.job_id"] != "", f"a UDP frame not decoded as QAINA: {d}"
        p = {n: int(d[f"qaina.{n}"], 0) for n in NAMES}
        p.update(src=d["ip.src"], dst=d["ip.dst"], count=int(d["qaina.words"]),
                 words=[int(w, 16) for w in d["qaina.word"].split(",")])
        out.append(p)
    return out


def first_per_seq(packets: list[dict]) -> dict[int, list[int]]:
    """seq -> payload words of its first packet (a resent chunk carries the same)."""
    out: dict[int, list[int]] = {}
    for p in packets:
        out.setdefault(p["seq"], p["words"])
    return out


def test_a_captured_run_decodes_into_what_the_agents_sent(tmp_path, target):
    summary, directory = execute(tmp_path, topo="star", jobs=1, workers=2, iterations=2,
                                 target=target, pcap="h1,s1")
    assert summary["complete"]
    listing = json.loads((directory / "pcap" / "captures.json").read_text())
    assert listing["tool"] == "dumpcap" and listing["dissector"] == "qaina.lua"
    assert [f["file"] for f in listing["files"]] == [
        "h1-eth0.pcapng", "s1-eth1.pcapng", "s1-eth2.pcapng"]
    for f in listing["files"]:
        head = (directory / "pcap" / f["file"]).read_bytes()[:4]
        assert head == b"\x0a\x0d\x0d\x0a", "not pcapng"  # a section header block
        assert f["captured"] > 0 and f["dropped"] == 0 and not f["limit_reached"], f

    h1 = decode(directory, "h1-eth0")
    agents = {int(r["worker"]): r for r in csv.DictReader(open(directory / "iterations.csv"))}
    assert agents, "no iterations recorded"
    sent = [p for p in h1 if p["src"] == "10.0.0.1"]
    results = [p for p in h1 if p["dst"] == "10.0.0.1"]
    assert len(sent) + len(results) == len(h1)
    # job and worker ids as configured; flags consistent with the direction
    assert {p["job_id"] for p in h1} == {1}
    assert {p["worker"] for p in h1} == {0}
    assert all(not p["flags"] & FLAG_RESULT for p in sent)
    assert all(p["flags"] & FLAG_RESULT and not p["flags"] & FLAG_RETX for p in results)
    assert all(p["count"] == 32 == len(p["words"]) for p in h1)
    # every chunk of the stream went out and came back, numbered from 0 without gaps
    seqs = sorted(first_per_seq(sent))
    assert seqs == list(range(len(seqs))) and sorted(first_per_seq(results)) == seqs
    # the resent ones are those the agent counted
    retx = sum(int(r["retransmissions"]) for r in csv.DictReader(open(directory /
                                                                     "iterations.csv"))
               if r["worker"] == "0")
    assert sum(1 for p in sent if p["flags"] & FLAG_RETX) == retx
    # the switch side saw both workers of the job, and nothing but job 1
    s1 = decode(directory, "s1-eth1") + decode(directory, "s1-eth2")
    assert {p["job_id"] for p in s1} == {1}
    assert {p["worker"] for p in s1} == {0, 1}

    # The last iteration's payload: worker 0's packed levels out, the level sums back.
    z = np.load(directory / "agents" / "j1w0.npz")
    last = summary["iterations"] - 1
    levels, sums = z[f"levels_{last}"], z[f"sums_{last}"]
    fmt = LaneFormat(4, 2)
    chunks = -(-len(levels) // (32 * fmt.lanes))
    tail = seqs[-chunks:]
    out_words = np.array([first_per_seq(sent)[s] for s in tail], dtype=np.uint32).reshape(-1)
    assert np.array_equal(out_words, fmt.pack(levels, len(out_words)))
    back = np.array([first_per_seq(results)[s] for s in tail], dtype=np.uint32).reshape(-1)
    assert np.array_equal(fmt.unpack_sum(back, len(sums)), sums)


def test_tcpdump_is_used_where_dumpcap_is_missing(tmp_path, monkeypatch):
    if shutil.which("tcpdump") is None:
        pytest.skip("tcpdump missing: apt-get install tcpdump")
    monkeypatch.setattr(capture, "TOOLS", ("tcpdump",))  # as on a machine without dumpcap
    summary, directory = execute(tmp_path, topo="star", jobs=1, workers=2, iterations=1,
                                 pcap="s1-eth2")
    listing = json.loads((directory / "pcap" / "captures.json").read_text())
    assert listing["tool"] == "tcpdump"
    assert (directory / "pcap" / "s1-eth2.pcap").read_bytes()[:4] == b"\xd4\xc3\xb2\xa1"
    packets = decode(directory, "s1-eth2", ".pcap")
    assert packets and {p["job_id"] for p in packets} == {1}
    assert {p["worker"] for p in packets} == {1}  # h2, worker 1, behind s1-eth2
    assert listing["files"][0]["captured"] == len(packets)


def read_until(proc: subprocess.Popen, text: bytes, timeout: float = 120.0) -> bytes:
    out, deadline = b"", time.monotonic() + timeout
    while text not in out and time.monotonic() < deadline:
        if select.select([proc.stdout], [], [], 0.1)[0]:
            chunk = os.read(proc.stdout.fileno(), 4096)
            if not chunk:
                break
            out += chunk
    return out


def held_run(tmp_path, run_id: str) -> tuple[subprocess.Popen, dict]:
    """A run with --pcap h1 whose jobs are done and whose network is held up; its
    record."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "qaina_bench.harness.cli", "up", "--topo", "star", "--jobs",
         "1", "--workers", "2", "--iterations", "1", "--pcap", "h1", "--hold",
         "--results-dir", str(tmp_path), "--run-id", run_id],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out = read_until(proc, b"stays up until Ctrl-C")
    assert b"stays up until Ctrl-C" in out, out.decode(errors="replace")
    record = json.loads((record_dir() / f"{run_id}.json").read_text())
    assert record["captures"]["tool"] == "dumpcap"
    return proc, record


def capture_pids(record: dict) -> list[int]:
    return [p["pid"] for p in record["processes"] if p["what"].startswith("dumpcap on")]


def left(record: dict) -> list[str]:
    rec = RunRecord(record["run_id"], directory=record_dir())
    rec.data = record
    return rec.leftovers()


def test_ctrl_c_stops_the_capture_and_keeps_its_file(tmp_path):
    proc, record = held_run(tmp_path, "pcap-ctrl-c")
    assert len(capture_pids(record)) == 1
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out  # a held run ends as usual on Ctrl-C
    assert b"ending the held run" in out
    assert not left(record)
    listing = json.loads((tmp_path / "pcap-ctrl-c" / "pcap" / "captures.json").read_text())
    assert listing["files"][0]["captured"] > 0
    assert decode(tmp_path / "pcap-ctrl-c", "h1-eth0")


def test_clean_stops_the_capture_of_a_killed_run_and_its_file_is_whole(tmp_path):
    proc, record = held_run(tmp_path, "pcap-killed")
    proc.kill()
    proc.wait()
    pid = capture_pids(record)[0]
    assert os.path.exists(f"/proc/{pid}"), "the capture ended with the CLI"
    out = subprocess.run([sys.executable, "-m", "qaina_bench.harness.cli", "clean"],
                         capture_output=True, text=True, timeout=120)
    assert f"stopped dumpcap on h1-eth0 (pid {pid})" in out.stdout, out.stdout + out.stderr
    assert not left(record)
    packets = decode(tmp_path / "pcap-killed", "h1-eth0")
    assert packets and {p["job_id"] for p in packets} == {1}


def test_an_unknown_name_is_one_line_and_nothing_starts(tmp_path):
    out = subprocess.run([sys.executable, "-m", "qaina_bench.harness.cli", "up", "--topo",
                          "star", "--jobs", "1", "--workers", "2", "--pcap", "h1,h9",
                          "--results-dir", str(tmp_path)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: --pcap h9: not a node"), lines
    assert "nodes: h1, h2, s1; interfaces: h1-eth0, h2-eth0, s1-eth1, s1-eth2" in lines[0]
    assert not list(tmp_path.iterdir()) and not list(record_dir().glob("*.json"))
