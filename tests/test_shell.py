"""p4runtime-shell against both targets, from its own venv (``make shell-tool``; the
tests install it when it is missing and skip, saying why, when it cannot be).

The shell comes in as a backup below the harness's election id and reads; with the
harness gone it becomes primary and writes.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from conftest import IS_ROOT, SwitchLab
from qaina_bench.harness.control import PRIMARY_ELECTION_ID
from qaina_bench.harness.shelltool import (PROJECT_DIR, ShellError, backup_election_id,
                                           shell_python, shell_venv)
from qaina_bench.harness.targets import bmv2_missing

CLIENT = Path(__file__).with_name("shell_client.py")
TABLES = ["MyEgress.result_rewrite", "MyIngress.aggregator_addr", "MyIngress.ipv4_lpm",
          "MyIngress.job_table", "MyIngress.member_table"]


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


@pytest.fixture(scope="module", params=["embedded", "bmv2"])
def server(request, tmp_path_factory):
    if not IS_ROOT:
        pytest.skip("needs root: veth pairs, raw sockets")
    if request.param == "bmv2" and bmv2_missing():
        pytest.skip(f"BMv2 target: {bmv2_missing()}")
    lab = SwitchLab(request.param, 2, tmp_path_factory.mktemp("shell"))
    yield lab
    lab.close()


@pytest.fixture
def fresh(server):
    server.reset()
    return server


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
                     bits=4, lane_width=6, lanes=5))  # the harness is still primary


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
