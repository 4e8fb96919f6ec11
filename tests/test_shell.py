"""p4runtime-shell against both targets, from its own venv (``make shell-tool``; the
tests install it when it is missing and skip, saying why, when it cannot be), and
``qaina-bench shell`` attached to a run that ``up --hold`` keeps up.

The shell comes in as a backup below the harness's election id and reads; with the
harness gone it becomes primary and writes.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import SwitchLab, root
from qaina_bench.harness.switches.control import PRIMARY_ELECTION_ID
from qaina_bench.p4.p4info import P4Info
from qaina_bench.harness.running.record import RunRecord, record_dir
from qaina_bench.harness.shelltool import (PROJECT_DIR, ShellError, backup_election_id,
                                           find_switch, shell_python, shell_venv)

CLIENT = Path(__file__).with_name("shell_client.py")
TABLES = sorted(t.name for t in P4Info.load().tables.values())  # what the shell must list


@pytest.fixture(scope="session")
def tool_python() -> Path:
    """The python of the shell's venv, made with ``make shell-tool`` if missing."""
    try:
        return shell_python()
    except ShellError:
        pass
    if shutil.which("make") is None:
        pytest.skip("p4runtime-shell is not installed and make is missing to install it")
    res = subprocess.run(["make", "-C", str(PROJECT_DIR), "shell-tool",
                          f"SHELL_VENV={shell_venv()}"], capture_output=True, text=True,
                         timeout=900)
    if res.returncode != 0:
        said = [line for line in (res.stdout + res.stderr).splitlines()
                if line.strip() and not line.startswith(("make", "WARNING"))]
        pytest.skip("p4runtime-shell cannot be installed here (make shell-tool failed: "
                    f"{said[-1] if said else 'no output'})")
    return shell_python()


def test_the_checkout_never_shadows_the_shells_protobufs(tool_python):
    """p4/ has no __init__.py: with a checkout's root first on sys.path (the shell's
    python run from it), ``import p4`` still finds p4runtime's protobufs, which a
    regular package p4/ would hide. The folder is the package qaina_bench.p4."""
    assert not (PROJECT_DIR / "p4" / "__init__.py").exists()
    out = subprocess.run([str(tool_python), "-c", "import sys; sys.path.insert(0, sys.argv[1]);"
                          " import p4.v1.p4runtime_pb2 as m; print(m.__file__)",
                          str(PROJECT_DIR)], capture_output=True, text=True, check=True).stdout
    assert not out.strip().startswith(str(PROJECT_DIR / "p4"))


def run_shell(python: Path, lab: SwitchLab, election: tuple[int, int], *args) -> dict:
    res = subprocess.run([str(python), "-I", str(CLIENT), "--grpc-addr", lab.target.grpc_addr,
                          "--device-id", "1", "--election-id", f"{election[0]},{election[1]}",
                          *args], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_the_shell_reads_as_a_backup_and_the_harness_stays_primary(fresh, tool_python):
    conn = fresh.conn
    conn.insert("MyIngress.aggregator_addr", {"hdr.ipv4.dstAddr": 0x0AFF0001},
                "MyIngress.accept_qaina")
    fresh.hosts[1].send(b"\xff" * 6 + b"\x02" * 6 + b"\x88\xb5" + bytes(46))  # not IPv4
    deadline = time.monotonic() + 10
    while conn.read_counter("MyIngress.drops")[0][0] < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    seen = run_shell(tool_python, fresh, backup_election_id(), "--write-job", "5")
    assert seen["tables"] == TABLES
    assert seen["aggregator_addr"] == ["0aff0001"]
    assert seen["drops"] == {str(i): int(i == 0) for i in range(16)}
    assert "PERMISSION_DENIED" in seen["write"] and seen["jobs"] == []
    conn.insert("MyIngress.job_table", {"hdr.qaina.job_id": 5}, "MyIngress.set_job",
                dict(job_index=1, n_workers=4, slot_base=0, slot_count=8, mcast_grp=2,
                     bits=4, lane_width=6, lanes=5, shared=0))  # the harness is still primary


def test_the_shell_writes_as_primary_when_the_harness_is_gone(fresh, tool_python):
    fresh.conn.close()
    try:
        seen = run_shell(tool_python, fresh, PRIMARY_ELECTION_ID, "--write-job", "5")
    finally:
        fresh.reconnect()
    assert seen["write"] == "ok" and seen["jobs"] == ["05"]
    entries = fresh.conn.read_table("MyIngress.job_table")
    assert len(entries) == 1
    assert [p.value for p in entries[0].action.action.params][1] == b"\x04"


# -- a live run ---------------------------------------------------------------------
def test_qaina_bench_shell_says_in_one_line_what_is_wrong(tmp_path, monkeypatch):
    """Runs are found through their records (this process stands for a live run's
    owner); every mistake is one line, and nothing is started."""
    monkeypatch.setenv("QAINA_RECORD_DIR", str(tmp_path))

    def shell(*args, venv=None):
        env = dict(os.environ, QAINA_RECORD_DIR=str(tmp_path))
        if venv is not None:
            env["QAINA_SHELL_VENV"] = str(venv)
        res = subprocess.run([sys.executable, "-m", "qaina_bench.harness.cli", "shell", *args],
                             capture_output=True, text=True, env=env, timeout=60)
        errors = [line for line in res.stderr.splitlines() if line.startswith("Error: ")]
        assert res.returncode != 0 and len(errors) == 1, res.stderr
        return errors[0]

    assert "no run is up: start one with `qaina-bench up --hold`" in shell("s1")
    first = RunRecord("first", tmp_path)
    first.add_switch("s1", "127.0.0.1:9", 1, "embedded")
    first.save()
    assert "run first has no switch 'sp9'; its switches: s1" in shell("sp9")
    assert "no run other is up (up: first)" in shell("s1", "--run", "other")
    assert "--run '../first': a run id" in shell("s1", "--run", "../first")
    assert "make shell-tool" in shell("s1", venv=tmp_path / "no-venv")
    assert "'x': expected HIGH,LOW" in shell("s1", "--election-id", "x")
    RunRecord("second", tmp_path).save()
    assert "runs first, second are up: choose one with --run" in shell("s1")
    found = find_switch("s1", "first")
    assert (found.grpc_addr, found.device_id, found.target) == ("127.0.0.1:9", 1, "embedded")


class Output(threading.Thread):
    """Everything a process prints, collected as it comes."""

    def __init__(self, stream):
        super().__init__(daemon=True)
        self.stream, self.text = stream, ""

    def run(self):
        for chunk in iter(lambda: self.stream.read1(4096), b""):
            self.text += chunk.decode(errors="replace")


SHELL_INPUT = """\
print("ROUTES", len(list(TableEntry("MyIngress.ipv4_lpm").read())))
print("JOBS", [e.match["hdr.qaina.job_id"].exact.value.hex() for e in TableEntry("MyIngress.job_table").read()])
print("AGG", sum(c.packet_count for c in CounterEntry("MyIngress.agg_packets").read()))
"""


@pytest.mark.slow
@root  # Mininet
@pytest.mark.skipif(shutil.which("mnexec") is None, reason="mnexec missing: apt-get install mininet")
def test_up_hold_keeps_the_run_for_qaina_bench_shell(tmp_path, tool_python):
    cli = [sys.executable, "-m", "qaina_bench.harness.cli"]
    up = subprocess.Popen(cli + ["up", "--topo", "star", "--jobs", "1", "--workers", "4",
                                 "--iterations", "2", "--hold", "--results-dir", str(tmp_path),
                                 "--run-id", "held"],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out = Output(up.stdout)
    out.start()
    try:
        deadline = time.monotonic() + 180
        while "stays up until Ctrl-C" not in out.text:
            assert up.poll() is None and time.monotonic() < deadline, out.text[-3000:]
            time.sleep(0.2)
        assert "qaina-bench shell SWITCH --run held" in out.text
        shell = subprocess.run(cli + ["shell", "s1", "--run", "held"], input=SHELL_INPUT,
                               capture_output=True, text=True, timeout=120)
        assert shell.returncode == 0, shell.stderr[-3000:]
        assert "not the primary client" in shell.stdout  # the harness stays primary
        assert "ROUTES 4" in shell.stdout and "JOBS ['01']" in shell.stdout, shell.stdout
        agg = int(shell.stdout.split("AGG ", 1)[1].split()[0])
        assert agg > 0
        assert up.poll() is None  # still held
    finally:
        up.send_signal(signal.SIGINT)
        up.wait(120)
        out.join(5)
    assert up.returncode == 0, out.text[-3000:]
    summary = json.loads((tmp_path / "held" / "summary.json").read_text())
    assert summary["status"] == "complete" and "held" in summary["events"]
    assert summary["software"]["protobuf_implementation"] == "upb"
    assert not (record_dir() / "held.json").exists()
    bad = subprocess.run(cli + ["shell", "s1", "--run", "held"], capture_output=True, text=True)
    assert bad.returncode != 0 and "no run held is up" in bad.stderr
