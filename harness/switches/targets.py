"""Switch targets: the programs that run ``qaina.p4``, started as processes.

``EmbeddedTarget`` runs the project's embedded switch; ``BMv2Target`` runs
``simple_switch_grpc --no-p4`` and hands it the p4c-compiled JSON with the P4Info.
Both are programmed over P4Runtime the same way; only the command line and the
device config bytes differ. Each target records the process it started and stops
exactly that process.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from ...p4 import program
from ...p4.header import QAINA_WORDS
from ...p4.p4info import P4Info, difference
from .firewall import FirewallError, ThriftGuard

TARGETS = ("embedded", "bmv2")


class TargetError(RuntimeError):
    """A switch program is missing, would not start, or did not become ready."""


def log_tail(path: Path, lines: int = 5) -> str:
    try:
        text = Path(path).read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(text[-lines:])


def _stat(pid: int) -> list[str]:
    """The fields of ``/proc/<pid>/stat`` after the command name (state first, then
    ppid, pgrp, session, tty, tpgid, flags, ...); [] for no such process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped by a signal (SIGSTOP, Ctrl-Z): it answers
    nothing until SIGCONT. A debugger's or profiler's trace stop is not counted."""
    return _stat(pid)[:1] == ["T"]


def dying(pid: int) -> bool:
    """Whether process ``pid`` is ending but not reaped yet: killed, its exit under way
    (the kernel closing a switch's packet sockets can take it a good part of a second)."""
    fields = _stat(pid)
    return len(fields) > 6 and (fields[0] in ("Z", "X") or bool(int(fields[6]) & 0x4))  # PF_EXITING


class SwitchProcess:
    """One switch program as a process: its ports, P4Runtime address and log file."""

    kind = "?"

    def __init__(self, name: str, interfaces: dict[int, str], grpc_port: int,
                 device_id: int, log_path: str | Path, cpu: int | None = None,
                 env: dict | None = None, words: int = QAINA_WORDS):
        self.name = name
        self.interfaces = dict(interfaces)
        self.grpc_port = grpc_port
        self.grpc_addr = f"127.0.0.1:{grpc_port}"
        self.device_id = device_id
        self.log_path = Path(log_path)
        self.cpu = cpu
        self.env = dict(env or {})  # added to this process's environment
        self.words = words  # payload words of the qaina.p4 build it runs
        self.proc: subprocess.Popen | None = None

    def command(self) -> list[str]:
        raise NotImplementedError

    def device_config(self) -> bytes:
        """The ``p4_device_config`` bytes of SetForwardingPipelineConfig."""
        return b""

    def fresh_pipeline(self, conn):
        """Install ``qaina.p4`` afresh through ``conn``: empty tables and multicast
        groups, every register and counter zero (P4Runtime's VERIFY_AND_COMMIT)."""
        conn.set_pipeline(self.device_config())

    def registers(self, conn):
        """What reads and writes this switch's registers (``read_register(name)``,
        ``write_registers(name, cells)``): ``conn``, over P4Runtime."""
        return conn

    def describe(self) -> dict:
        """What program runs the switch: for the results."""
        return {"target": self.kind, "payload_words": self.words}

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
        if self.proc.poll() is None and dying(self.proc.pid):  # say how it ended
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                pass
        if self.proc.poll() is not None:
            from ..running.processes import how_ended
            raise TargetError(f"{self.name} ({self.kind}) {how_ended(self.proc.returncode)}; "
                              f"its log {self.log_path} says: "
                              f"{log_tail(self.log_path)}")
        if stopped(self.proc.pid):
            raise TargetError(f"{self.name} ({self.kind}) is stopped by a signal (pid "
                              f"{self.proc.pid}, SIGSTOP): it answers nothing until SIGCONT")

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

    def terminate(self):
        """SIGTERM to the process this object started (its session only), no wait."""
        proc = self.proc
        if proc is not None and proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

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

    @property
    def stats_path(self) -> Path:
        """Where the switch writes its ports' counters when it stops."""
        return self.log_path.with_suffix(".stats.json")

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "qaina_bench.p4.embedded",
               "--device-id", str(self.device_id), "--grpc-addr", self.grpc_addr,
               "--log", str(self.log_path), "--stats", str(self.stats_path)]
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


def compile_p4(words: int = QAINA_WORDS, cache: Path | None = None,
               on=None) -> tuple[Path, Path]:
    """Compile the ``words``-word build of ``qaina.p4`` with p4c for BMv2; returns
    (bmv2 json, p4info text). ``on``: how to run a command on another machine (a
    function of the command's words giving its command line, ``Server.ssh``), whose
    p4c compiles it there instead (used when this machine has none).

    Kept in a cache here keyed by the source and the p4c version, written whole or not
    at all (several runs may compile at once).
    """
    p4c = shutil.which("p4c") if on is None else "p4c"
    if p4c is None:
        raise TargetError("p4c is not on PATH (install the P4 toolchain or use vagrant up)")
    text = program.source(words)
    version = _version(on("p4c", "--version") if on else [p4c, "--version"])
    if on is not None and version is None:
        raise TargetError("p4c does not run there")
    key = hashlib.sha256(text.encode() + (version or "").encode())
    root = cache or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) \
        / "qaina-bench" / "p4c"
    out = root / key.hexdigest()[:16]
    # p4c 1.2.4 refuses a .txtpb P4Info name, 1.2.5 warns that .txt is deprecated.
    numbers = tuple(int(x) for x in re.findall(r"\d+", (version or "").split("(")[0])[:3])
    suffix = ".txtpb" if numbers >= (1, 2, 5) else ".txt"
    json_path, info_path = out / "qaina.json", out / f"qaina.p4info{suffix}"
    if json_path.exists() and info_path.exists():
        return json_path, info_path
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=out.parent))
    try:
        if on is None:
            _p4c_here(p4c, text, work, info_path.name, words)
        else:
            _p4c_there(on, text, work, info_path.name, words)
        try:
            work.rename(out)
        except OSError:  # another process finished first
            if not json_path.exists():
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return json_path, info_path


def _p4c_here(p4c: str, text: str, work: Path, info_name: str, words: int):
    """p4c's qaina.json and P4Info of ``text`` written into ``work``."""
    source = work / "qaina.p4"
    source.write_text(text)
    cmd = [p4c, "--target", "bmv2", "--arch", "v1model", "-o", str(work),
           "--p4runtime-files", str(work / info_name), str(source)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    source.unlink()
    if res.returncode != 0:
        raise TargetError(f"p4c failed on the {words}-word qaina.p4: "
                          f"{res.stderr.strip()[-2000:]}")


def _p4c_there(on, text: str, work: Path, info_name: str, words: int):
    """The same, p4c run on another machine (``on``): the source goes on its stdin, the
    two files come back as a tar on its stdout, its temporary directory there is
    removed when it exits."""
    script = ('d=$(mktemp -d) || exit 1; trap \'rm -rf "$d"\' EXIT HUP INT TERM; '
              'cat >"$d/qaina.p4" && p4c --target bmv2 --arch v1model -o "$d" '
              f'--p4runtime-files "$d/{info_name}" "$d/qaina.p4" >&2 && '
              f'tar -C "$d" -cf - qaina.json {info_name}')
    try:
        res = subprocess.run(on("sh", "-c", script), input=text.encode(),
                             capture_output=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise TargetError(f"p4c there did not answer: {exc}") from None
    if res.returncode != 0:
        raise TargetError(f"p4c there failed on the {words}-word qaina.p4: "
                          f"{res.stderr.decode(errors='replace').strip()[-2000:]}")
    with tarfile.open(fileobj=io.BytesIO(res.stdout)) as tar:
        for name in ("qaina.json", info_name):
            (work / name).write_bytes(tar.extractfile(name).read())


def _version(cmd: list[str]) -> str | None:
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = (res.stdout or res.stderr).strip().splitlines()
    return lines[0].strip() if lines else None


def toolchain() -> dict:
    """Which BMv2 and p4c this machine has: paths and versions (None where missing)."""
    out = {}
    for tool, flag in (("simple_switch_grpc", "--version"), ("p4c", "--version")):
        path = shutil.which(tool)
        out[tool] = {"path": os.path.realpath(path) if path else None,
                     "version": _version([path, flag]) if path else None}
    return out


class BMv2Target(SwitchProcess):
    """``simple_switch_grpc`` started without a program (``--no-p4``).

    BMv2 logs every packet only when ``log_packets`` is set (``--switch-log``): its
    per-packet log costs more than half of its forwarding rate, so a measurement run
    never has it by default.

    Its Thrift server listens on every address; ``guard`` keeps the port for
    loopback only from before the switch starts until it stopped (``firewall.py``).
    """

    kind = "bmv2"

    def __init__(self, *args, thrift_port: int, log_packets: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.thrift_port = thrift_port
        self.log_packets = log_packets
        # Each instance needs its own nanomsg address, or the second one dies at start.
        self.notifications = (f"ipc:///tmp/qaina-bmv2-{os.getpid()}-{self.device_id}-"
                              f"{thrift_port}.ipc")
        self.guard = ThriftGuard(thrift_port)

    def start(self):
        try:
            self.guard.close_port()
        except FirewallError as exc:
            raise TargetError(f"{self.name}: {exc}") from None
        try:
            super().start()
        except BaseException:
            self.guard.remove()
            raise

    def command(self) -> list[str]:
        reason = bmv2_missing()
        if reason:
            raise TargetError(reason)
        return self.switch_command()

    def switch_command(self) -> list[str]:
        """The ``simple_switch_grpc`` command line of this switch."""
        cmd = ["simple_switch_grpc", "--no-p4", "--device-id", str(self.device_id),
               "--thrift-port", str(self.thrift_port),
               "--notifications-addr", self.notifications]
        if self.log_packets:
            cmd += ["--log-file", str(self.log_path.with_suffix(".bmv2")), "--log-flush"]
        for port, ifname in sorted(self.interfaces.items()):
            cmd += ["-i", f"{port}@{ifname}"]
        cmd += ["--", "--grpc-server-addr", self.grpc_addr]
        if self.cpu is not None:  # every thread of the switch on that CPU
            cmd = ["taskset", "-c", str(self.cpu)] + cmd
        return cmd

    def device_config(self) -> bytes:
        """p4c's JSON of this switch's build of ``qaina.p4``. BMv2 takes any P4Info
        with it, so this refuses to go on when p4c's P4Info is not the one the harness
        sends (``program.p4info``)."""
        json_path, info_path = self.compiled()
        why = difference(program.p4info(self.words).proto, P4Info.load(info_path).proto)
        if why:
            raise TargetError(f"p4c's P4Info of the {self.words}-word qaina.p4 differs from "
                              f"the committed one ({why}): run `make p4info`")
        return json_path.read_bytes()

    def compiled(self) -> tuple[Path, Path]:
        """p4c's JSON and P4Info of this switch's build (``compile_p4``)."""
        return compile_p4(self.words)

    def fresh_pipeline(self, conn):
        """BMv2 keeps register and counter values and its multicast nodes across a
        VERIFY_AND_COMMIT of the same program (a group written again then holds the
        old replicas too); its Thrift ``reset_state`` clears them, so "fresh" means
        the same on both targets."""
        super().fresh_pipeline(conn)
        out = self.cli(["reset_state"])
        if "Error" in out or "Invalid" in out:
            raise TargetError(f"{self.name}: reset_state failed: {out[-500:]}")

    def cli(self, commands: list[str]) -> str:
        """Run ``simple_switch_CLI`` commands on this switch (Thrift); returns its output."""
        try:
            res = subprocess.run(self.cli_command(), input="\n".join(commands) + "\n",
                                 capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise TargetError(f"{self.name}: simple_switch_CLI failed: {exc}") from None
        if "Could not connect to thrift client" in res.stdout + res.stderr:
            raise TargetError(f"{self.name}: no Thrift server answers on port "
                              f"{self.thrift_port}, so registers cannot be read or reset: "
                              "a simple_switch_grpc built without Thrift (configure "
                              "targets/simple_switch_grpc --with-thrift), or it has stopped")
        return res.stdout + res.stderr

    def cli_command(self) -> list[str]:
        """``simple_switch_CLI`` on this switch's Thrift port, over loopback."""
        return ["simple_switch_CLI", "--thrift-ip", "127.0.0.1",
                "--thrift-port", str(self.thrift_port)]

    def registers(self, conn):
        """BMv2's P4Runtime server neither reads nor writes registers: its Thrift
        CLI does (``ThriftRegisters``)."""
        return ThriftRegisters(self)

    def register_read(self, name: str) -> list[int]:
        """A whole register array through BMv2's Thrift CLI (P4Runtime cannot)."""
        out = self.cli([f"register_read {name}"])
        for line in out.splitlines():
            if "=" in line and name in line:
                return [int(v) for v in line.split("=", 1)[1].split(",") if v.strip()]
        raise TargetError(f"register_read {name} failed: {out[-1000:]}")

    def describe(self) -> dict:
        return {**super().describe(), "log_packets": self.log_packets, **toolchain()}

    def stop(self, timeout: float = 5.0):
        super().stop(timeout)
        path = self.notifications[len("ipc://"):]
        if os.path.exists(path):
            os.unlink(path)
        self.guard.remove()


class ThriftRegisters:
    """A BMv2 switch's registers through ``simple_switch_CLI``, with the methods of
    ``SwitchConnection`` that read and write them."""

    def __init__(self, target: BMv2Target):
        self.target = target

    def read_register(self, name: str) -> dict[int, int]:
        return dict(enumerate(self.target.register_read(name)))

    def write_registers(self, name: str, cells: dict[int, int]):
        if not cells:
            return
        out = self.target.cli([f"register_write {name} {i} {v}"
                               for i, v in sorted(cells.items())])
        if "Error" in out or "Invalid" in out:
            raise TargetError(f"{self.target.name}: register_write {name} failed: "
                              f"{out[-500:]}")


def make_target(kind: str, *args, thrift_port: int | None = None, log_packets: bool = False,
                **kwargs) -> SwitchProcess:
    if kind == "embedded":
        return EmbeddedTarget(*args, **kwargs)
    if kind == "bmv2":
        return BMv2Target(*args, thrift_port=thrift_port, log_packets=log_packets, **kwargs)
    raise TargetError(f"unknown target {kind!r}: choose one of {', '.join(TARGETS)}")
