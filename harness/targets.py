"""Switch targets: the programs that run ``qaina.p4``, started as processes.

``EmbeddedTarget`` runs the project's embedded switch; ``BMv2Target`` runs
``simple_switch_grpc --no-p4`` and hands it the p4c-compiled JSON with the P4Info.
Both are programmed over P4Runtime the same way; only the command line and the
device config bytes differ. Each target records the process it started and stops
exactly that process.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from ..p4.p4info import P4_SOURCE

TARGETS = ("embedded", "bmv2")


class TargetError(RuntimeError):
    """A switch program is missing, would not start, or did not become ready."""


def log_tail(path: Path, lines: int = 5) -> str:
    try:
        text = Path(path).read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(text[-lines:])


class SwitchProcess:
    """One switch program as a process: its ports, P4Runtime address and log file."""

    kind = "?"

    def __init__(self, name: str, interfaces: dict[int, str], grpc_port: int,
                 device_id: int, log_path: str | Path, cpu: int | None = None,
                 env: dict | None = None):
        self.name = name
        self.interfaces = dict(interfaces)
        self.grpc_port = grpc_port
        self.grpc_addr = f"127.0.0.1:{grpc_port}"
        self.device_id = device_id
        self.log_path = Path(log_path)
        self.cpu = cpu
        self.env = dict(env or {})  # added to this process's environment
        self.proc: subprocess.Popen | None = None

    def command(self) -> list[str]:
        raise NotImplementedError

    def device_config(self) -> bytes:
        """The ``p4_device_config`` bytes of SetForwardingPipelineConfig."""
        return b""

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def start(self):
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True,
                                         env={**os.environ, **self.env})

    def check_alive(self):
        if self.proc is None:
            raise TargetError(f"{self.name}: not started")
        if self.proc.poll() is not None:
            raise TargetError(f"{self.name} ({self.kind}) exited with code "
                              f"{self.proc.returncode}; its log {self.log_path} says: "
                              f"{log_tail(self.log_path)}")

    def wait_ready(self, connection, timeout: float = 20.0):
        """Wait until the switch answers P4Runtime on its address."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.check_alive()
            if connection.wait_ready(timeout=0.25):
                return
        self.check_alive()
        raise TargetError(f"{self.name} ({self.kind}) did not answer P4Runtime on "
                          f"{self.grpc_addr} within {timeout:.0f} s; see {self.log_path}")

    def stop(self, timeout: float = 5.0):
        """Stop the process this object started (its session only), then reap it."""
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout)


class EmbeddedTarget(SwitchProcess):
    """The embedded switch, ``python -m qaina_bench.p4.embedded``."""

    kind = "embedded"

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "qaina_bench.p4.embedded",
               "--device-id", str(self.device_id), "--grpc-addr", self.grpc_addr,
               "--log", str(self.log_path)]
        if self.cpu is not None:
            cmd += ["--cpu", str(self.cpu)]
        for port, ifname in sorted(self.interfaces.items()):
            cmd += ["--interface", f"{port}@{ifname}"]
        return cmd


def bmv2_missing() -> str | None:
    """Why BMv2 cannot run here (None when it can)."""
    missing = [tool for tool in ("simple_switch_grpc", "p4c") if shutil.which(tool) is None]
    if missing:
        return (f"{' and '.join(missing)} not on PATH: BMv2 and p4c come from the Vagrant "
                "VM (vagrant up) or a P4 toolchain install; the embedded target needs neither")
    return None


def compile_p4(source: Path = P4_SOURCE, cache: Path | None = None) -> tuple[Path, Path]:
    """Compile ``qaina.p4`` with p4c for BMv2; returns (bmv2 json, p4info text), cached."""
    if shutil.which("p4c") is None:
        raise TargetError("p4c is not on PATH (install the P4 toolchain or use vagrant up)")
    digest = hashlib.sha256(source.read_bytes()).hexdigest()[:16]
    out = (cache or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
           / "qaina-bench" / "p4c" / digest)
    json_path, info_path = out / "qaina.json", out / "qaina.p4info.txt"
    if json_path.exists() and info_path.exists():
        return json_path, info_path
    out.mkdir(parents=True, exist_ok=True)
    # p4c 1.2.4 rejects a .txtpb P4Info name; .txt works with every version.
    cmd = ["p4c", "--target", "bmv2", "--arch", "v1model", "-o", str(out),
           "--p4runtime-files", str(info_path), str(source)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise TargetError(f"p4c failed on {source}: {res.stderr.strip()[-2000:]}")
    return json_path, info_path


class BMv2Target(SwitchProcess):
    """``simple_switch_grpc`` started without a program (``--no-p4``)."""

    kind = "bmv2"

    def __init__(self, *args, thrift_port: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.thrift_port = thrift_port
        # Each instance needs its own nanomsg address, or the second one dies at start.
        self.notifications = f"ipc:///tmp/qaina-bmv2-{os.getpid()}-{self.device_id}.ipc"

    def command(self) -> list[str]:
        reason = bmv2_missing()
        if reason:
            raise TargetError(reason)
        cmd = ["simple_switch_grpc", "--no-p4", "--device-id", str(self.device_id),
               "--thrift-port", str(self.thrift_port),
               "--notifications-addr", self.notifications,
               "--log-file", str(self.log_path.with_suffix(".bmv2")), "--log-flush"]
        for port, ifname in sorted(self.interfaces.items()):
            cmd += ["-i", f"{port}@{ifname}"]
        return cmd + ["--", "--grpc-server-addr", self.grpc_addr]

    def device_config(self) -> bytes:
        json_path, _ = compile_p4()
        return json_path.read_bytes()

    def register_read(self, name: str) -> list[int]:
        """A whole register array through BMv2's Thrift CLI (P4Runtime cannot)."""
        res = subprocess.run(["simple_switch_CLI", "--thrift-port", str(self.thrift_port)],
                             input=f"register_read {name}\n", capture_output=True, text=True,
                             timeout=60)
        for line in res.stdout.splitlines():
            if "=" in line and name in line:
                return [int(v) for v in line.split("=", 1)[1].split(",") if v.strip()]
        raise TargetError(f"register_read {name} failed: {res.stdout[-500:]} {res.stderr[-500:]}")

    def stop(self, timeout: float = 5.0):
        super().stop(timeout)
        path = self.notifications[len("ipc://"):]
        if os.path.exists(path):
            os.unlink(path)


def make_target(kind: str, *args, thrift_port: int | None = None, **kwargs) -> SwitchProcess:
    if kind == "embedded":
        return EmbeddedTarget(*args, **kwargs)
    if kind == "bmv2":
        return BMv2Target(*args, thrift_port=thrift_port, **kwargs)
    raise TargetError(f"unknown target {kind!r}: choose one of {', '.join(TARGETS)}")
