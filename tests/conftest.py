"""Shared fixtures: a switch lab on real veth pairs, for either target."""

from __future__ import annotations

import os
import select
import shutil
import socket
import subprocess
import sys
import time

import pytest

from qaina_bench.harness.switches.control import SwitchConnection
from qaina_bench.harness.switches.targets import bmv2_missing, make_target
from qaina_bench.p4 import program
from qaina_bench.p4.embedded.ports import ETH_P_ALL, PACKET_IGNORE_OUTGOING, SOL_PACKET
from qaina_bench.p4.header import QAINA_WORDS

IS_ROOT = os.geteuid() == 0
#: Tests that need root (veth pairs, raw sockets, namespaces, nftables, Mininet) carry
#: ``root``, and those that start BMv2 ``bmv2`` as well: ``pytest -m "not root"`` runs
#: the rest as any user. A marked test skips, saying why, where it cannot run.
root = pytest.mark.root
bmv2 = pytest.mark.bmv2


def kinds(*names: str) -> list:
    """Fixture parameters of switch kinds ("embedded", "bmv2-w64", ...), marked."""
    return [pytest.param(n, marks=[root, bmv2] if n.startswith("bmv2") else [root])
            for n in names]


def pytest_runtest_setup(item):
    if item.get_closest_marker("root") and not IS_ROOT:
        pytest.skip("needs root: veth pairs, raw sockets, namespaces or Mininet")
    if item.get_closest_marker("bmv2") and bmv2_missing():
        pytest.skip(f"BMv2 target: {bmv2_missing()}")


@pytest.fixture(autouse=True, scope="session")
def trace_dir(tmp_path_factory):
    """The user's trace directory of the tests: a directory of their own."""
    path = tmp_path_factory.mktemp("traces")
    old = os.environ.get("QAINA_TRACE_DIR")
    os.environ["QAINA_TRACE_DIR"] = str(path)
    yield path
    if old is None:
        del os.environ["QAINA_TRACE_DIR"]
    else:
        os.environ["QAINA_TRACE_DIR"] = old


@pytest.fixture(autouse=True, scope="session")
def record_dir(tmp_path_factory):
    """Run records of the tests (and of the CLIs they start) in a directory of their
    own, never among a user's runs in /run/qaina-bench."""
    path = tmp_path_factory.mktemp("records")
    old = os.environ.get("QAINA_RECORD_DIR")
    os.environ["QAINA_RECORD_DIR"] = str(path)
    yield path
    if old is None:
        del os.environ["QAINA_RECORD_DIR"]
    else:
        os.environ["QAINA_RECORD_DIR"] = old


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def as_nobody(*argv, env=None, timeout=300) -> subprocess.CompletedProcess:
    """``python argv`` (this interpreter) as an unprivileged user: nobody when root runs
    the tests (root reads and writes everything), else the user running them."""
    drop = (["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
            if IS_ROOT else [])
    if drop and not shutil.which("setpriv"):
        pytest.skip("setpriv (util-linux) is missing: cannot run as another user")
    return subprocess.run(drop + [sys.executable, *argv], capture_output=True, text=True,
                          timeout=timeout, cwd="/", env=env)


def ip(*args):
    subprocess.run(["ip", *args], check=True, capture_output=True)


#: Seconds between two frames a test sends to BMv2, which drops frames that arrive
#: back to back on capture (DESIGN.md, "Facts about the real BMv2"); the cases test
#: the pipeline, not BMv2's capture.
BMV2_PACE = 0.002


class HostPort:
    """The far end of a switch port: a raw socket to send and capture frames."""

    def __init__(self, ifname: str, pace: float = 0.0):
        self.ifname = ifname
        self.pace = pace
        self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        self.sock.bind((ifname, ETH_P_ALL))
        self.sock.setsockopt(SOL_PACKET, PACKET_IGNORE_OUTGOING, 1)

    def send(self, frame) -> None:
        self.sock.send(bytes(frame))
        if self.pace:
            time.sleep(self.pace)

    def recv(self, timeout: float = 0.5, count: int | None = None) -> list[bytes]:
        """Frames that arrive within ``timeout`` (stops early after ``count``)."""
        frames = []
        deadline = time.monotonic() + timeout
        while count is None or len(frames) < count:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(4096)
            except (socket.timeout, BlockingIOError):
                break
            if data[12:14] == b"\x08\x00":  # the lab has IPv6 off; keep IPv4 only
                frames.append(data)
        return frames

    def drain(self) -> int:
        """Drop the frames waiting; how many there were."""
        dropped = 0
        self.sock.setblocking(False)
        try:
            while True:
                self.sock.recv(4096)
                dropped += 1
        except BlockingIOError:
            pass
        finally:
            self.sock.setblocking(True)
        return dropped

    def close(self):
        self.sock.close()


class VethLab:
    """``n`` veth pairs: switch side ``<prefix><i>s``, host side ``<prefix><i>h``."""

    def __init__(self, n: int):
        self.prefix = f"qc{os.getpid() % 10000}x"
        self.pairs = {}
        try:
            for i in range(1, n + 1):
                sw, host = f"{self.prefix}{i}s", f"{self.prefix}{i}h"
                ip("link", "add", sw, "type", "veth", "peer", "name", host)
                self.pairs[i] = (sw, host)
                for ifname in (sw, host):
                    subprocess.run(["sysctl", "-qw", f"net.ipv6.conf.{ifname}.disable_ipv6=1"],
                                   capture_output=True)
                    ip("link", "set", ifname, "up")
        except Exception:
            self.remove()
            raise

    def remove(self):
        for sw, _ in self.pairs.values():
            subprocess.run(["ip", "link", "del", sw], capture_output=True)
        self.pairs.clear()


class SwitchLab:
    """A switch of one target on veth ports 1..n, programmed over P4Runtime."""

    def __init__(self, kind: str, n_ports: int, tmp_path, words: int = QAINA_WORDS,
                 env: dict | None = None):
        """``kind``: "embedded", "embedded-sockets" (no PACKET_MMAP rings) or "bmv2";
        ``words``: the payload words of the qaina.p4 build it runs; ``env``: added to
        the switch's environment."""
        self.kind = kind
        self.words = words
        self.p4info = program.p4info(words)
        self.veths = VethLab(n_ports)
        extra = {"thrift_port": free_port()} if kind == "bmv2" else {}
        extra["env"] = dict(env or {})
        if kind == "embedded-sockets":
            extra["env"]["QAINA_SWITCH_RINGS"] = "0"
        self.target = make_target(kind.split("-")[0], "s1",
                                  {i: sw for i, (sw, _) in self.veths.pairs.items()},
                                  free_port(), 1, tmp_path / "s1.log", words=words, **extra)
        self.conn = None
        self.hosts = {}
        try:
            self.target.start()
            # A high election id leaves room for backup clients below it.
            self.conn = SwitchConnection("s1", self.target.grpc_addr, 1, p4info=self.p4info,
                                         election_id=(1, 0))
            self.target.wait_ready(self.conn)
            self.conn.arbitrate()
            pace = BMV2_PACE if kind == "bmv2" else 0.0
            self.hosts = {i: HostPort(h, pace) for i, (_, h) in self.veths.pairs.items()}
        except Exception:
            self.close()
            raise

    def reconnect(self):
        """A new primary connection (after the old one was closed)."""
        self.conn = SwitchConnection("s1", self.target.grpc_addr, 1, p4info=self.p4info,
                                     election_id=(1, 0))
        self.conn.arbitrate(held_for=5)  # the closed one's id, until the server sees it go

    def reset(self, quiet: float = 0.05, longest: float = 2.0):
        """A fresh pipeline: empty tables, zero registers and counters; then the ports
        drained until none has had a frame for ``quiet`` seconds (at most ``longest``):
        on a busy machine a frame the previous test caused can still be on its way."""
        self.target.fresh_pipeline(self.conn)
        deadline = time.monotonic() + longest
        while True:
            arrived = sum(h.drain() for h in self.hosts.values())
            if time.monotonic() > deadline or (not arrived and self._quiet(quiet)):
                return

    def _quiet(self, seconds: float) -> bool:
        """No port has a frame within ``seconds``."""
        ready = select.select([h.sock for h in self.hosts.values()], [], [], seconds)[0]
        return not ready

    def registers(self) -> dict[str, list[int]]:
        """Every cell of every register; for builds beyond 32 words all but agg_sum,
        whose 128 Ki..512 Ki cells take seconds to read each time (a packet that
        reached agg_sum would have changed agg_seen and agg_count too, and the tests
        complete the slots they touch exactly)."""
        names = [r.name for r in self.conn.p4info.registers.values()
                 if self.words == QAINA_WORDS or not r.name.endswith("agg_sum")]
        if self.kind == "bmv2":
            return {n: self.target.register_read(n) for n in names}
        out = {}
        for n in names:
            cells = self.conn.read_register(n)
            out[n] = [cells[i] for i in range(len(cells))]
        return out

    def counters(self, name: str) -> dict[int, tuple[int, int]]:
        return self.conn.read_counter(name)

    def close(self):
        for h in self.hosts.values():
            h.close()
        if self.conn is not None:
            self.conn.close()
        self.target.stop()
        self.veths.remove()


def open_lab(param: str, tmp_path_factory, ports: int = 5):
    """The lab of a fixture parameter: a kind, with ``-w<N>`` for another build."""
    if not IS_ROOT:  # a marked test was skipped before it got here
        pytest.fail("this test needs root and is not marked root")
    kind, _, words = param.partition("-w")
    if kind == "bmv2" and bmv2_missing():
        pytest.skip(f"BMv2 target: {bmv2_missing()}")
    return SwitchLab(kind, ports, tmp_path_factory.mktemp(param),
                     int(words) if words else QAINA_WORDS)


@pytest.fixture(scope="module", params=kinds("embedded", "embedded-sockets", "bmv2"))
def lab(request, tmp_path_factory):
    lab = open_lab(request.param, tmp_path_factory)
    yield lab
    lab.close()


@pytest.fixture(scope="module", params=kinds("embedded", "bmv2"))
def server(request, tmp_path_factory):
    """A two-port switch of each target, for the P4Runtime suites."""
    lab = open_lab(request.param, tmp_path_factory, ports=2)
    yield lab
    lab.close()


@pytest.fixture
def fresh(server):
    """``server`` with a fresh pipeline."""
    server.reset()
    return server
