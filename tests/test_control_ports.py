"""No control port of a switch is reachable from outside the machine: the embedded
switch listens on its P4Runtime address (127.0.0.1) only, and BMv2's Thrift port,
which simple_switch_grpc opens on every address, is reachable
over loopback only while a switch runs, and the nftables table that does it goes
with the switch: at teardown, and through ``qaina-bench clean`` when the run that
made it was killed.

The switch starts the way a run starts it (``QainaSwitch`` with a run record); the
far side is a network namespace of the test's own, joined to the root namespace by a
veth pair with addresses from 198.18.0.0/15 (RFC 2544's benchmarking range, used
here by this test only).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from conftest import bmv2, kinds, root
from qaina_bench.harness.switches.firewall import table_exists
from qaina_bench.harness.switches.targets import TargetError
from qaina_bench.harness.running.record import RunRecord, record_dir

pytestmark = root  # namespaces, nftables

ROOT_ADDR, FAR_ADDR = "198.18.213.1", "198.18.213.2"


def run(*cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


@pytest.fixture
def far_side():
    """A namespace with a veth link to the root namespace; yields a function that
    tries a TCP connect from there and says how it went."""
    tag = f"qtg{os.getpid() % 100000}"
    ns, near, far = tag, f"{tag}a", f"{tag}b"
    try:
        for cmd in (["ip", "netns", "add", ns],
                    ["ip", "link", "add", near, "type", "veth", "peer", "name", far],
                    ["ip", "link", "set", far, "netns", ns],
                    ["ip", "addr", "add", f"{ROOT_ADDR}/30", "dev", near],
                    ["ip", "link", "set", near, "up"],
                    ["ip", "-n", ns, "addr", "add", f"{FAR_ADDR}/30", "dev", far],
                    ["ip", "-n", ns, "link", "set", far, "up"],
                    ["ip", "-n", ns, "link", "set", "lo", "up"]):
            subprocess.run(cmd, check=True, capture_output=True)

        def connect(port: int) -> str:
            probe = ("import socket, sys\n"
                     "try:\n"
                     f"    socket.create_connection(('{ROOT_ADDR}', {port}), timeout=3)\n"
                     "    print('connected')\n"
                     "except ConnectionRefusedError:\n"
                     "    print('refused')\n"
                     "except OSError as exc:\n"
                     "    print('failed', exc)\n")
            res = run("ip", "netns", "exec", ns, sys.executable, "-c", probe, timeout=20)
            return res.stdout.strip() or res.stderr.strip()

        yield connect
    finally:
        run("ip", "link", "del", near)
        run("ip", "netns", "del", ns)


def start_switch(tmp_path, record):
    """A BMv2 switch started as a run starts its switches."""
    from qaina_bench.harness.running.network import QainaSwitch

    sw = QainaSwitch("s1", target="bmv2", device_id=1, log_dir=tmp_path, record=record)
    sw.start([])
    return sw


def listening_on_every_address(port: int) -> bool:
    return f"0.0.0.0:{port} " in run("ss", "-ltnH", f"sport = :{port}").stdout + " "


def loopback_connects(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=3).close()
        return True
    except OSError:
        return False


def wait_listening(port: int, proc, timeout: float = 20.0) -> None:
    import time
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, "simple_switch_grpc exited"
        if listening_on_every_address(port):
            return
        time.sleep(0.1)
    raise AssertionError(f"nothing listens on 0.0.0.0:{port}")


@bmv2
def test_the_thrift_port_answers_loopback_only_while_the_switch_runs(tmp_path, far_side):
    record = RunRecord("thrift-guard", directory=tmp_path)
    sw = start_switch(tmp_path, record)
    target = sw.target
    port = target.thrift_port
    try:
        wait_listening(port, target.proc)  # BMv2 listens on every address ...
        guard = {"family": "inet", "name": target.guard.table}
        assert guard in record.nft_tables() and table_exists("inet", guard["name"])
        assert far_side(port) == "refused"  # ... but the network is turned away
        assert loopback_connects(port)
        assert "iface name" in target.cli(["show_ports"])  # the harness's own use
        # The far side reaches the root namespace otherwise: a port the guard does
        # not cover, open on every address, answers it.
        with socket.create_server(("0.0.0.0", 0)) as other:
            assert far_side(other.getsockname()[1]) == "connected"
    finally:
        sw.stop()
        sw.terminate()
    assert not table_exists("inet", target.guard.table)
    assert record.leftovers(wait=0) == []
    # no Thrift server: an error, not output that reads like an answer (a register
    # reset that silently did nothing left the last run's sums in the registers)
    with pytest.raises(TargetError, match=f"no Thrift server answers on port {port}"):
        target.cli(["reset_state"])


@bmv2
def test_clean_removes_the_guard_of_a_killed_run(tmp_path):
    record = RunRecord("killed-bmv2", directory=record_dir())
    sw = start_switch(tmp_path, record)
    target = sw.target
    try:
        record.data["owner"] = 2 ** 22 + 12347  # no such process: the run was killed
        record.save()
        assert table_exists("inet", target.guard.table)
        res = run(sys.executable, "-m", "qaina_bench.harness.cli", "clean", timeout=60)
        assert f"deleted nftables table inet {target.guard.table}" in res.stdout, res
        assert "stopped switch s1" in res.stdout
        assert not table_exists("inet", target.guard.table)
        assert target.proc.wait(10) is not None
    finally:
        sw.stop()
        sw.terminate()
        record.path.unlink(missing_ok=True)


@pytest.mark.parametrize("kind", kinds("embedded", "bmv2"))
def test_a_switch_listens_on_loopback_only_but_for_bmv2s_guarded_thrift_port(
        kind, tmp_path_factory):
    import psutil

    from conftest import open_lab

    lab = open_lab(kind, tmp_path_factory, ports=1)
    try:
        proc = psutil.Process(lab.target.pid)
        listening = sorted((c.laddr.ip.removeprefix("::ffff:"), c.laddr.port)
                           for p in [proc, *proc.children(recursive=True)]
                           for c in p.net_connections(kind="inet")
                           if c.status == psutil.CONN_LISTEN)
        expected = [("127.0.0.1", lab.target.grpc_port)]
        if kind == "bmv2":
            expected.append(("0.0.0.0", lab.target.thrift_port))
            assert lab.target.guard.exists()
        assert listening == sorted(expected)
    finally:
        lab.close()
