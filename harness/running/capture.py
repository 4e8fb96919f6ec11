"""Packet capture of a run (``up --pcap``): one capture file per chosen interface.

``CapturePlan`` resolves ``--pcap h1,s1-eth2`` against the topology before anything
starts (a node name stands for all of its interfaces) and picks the capture tool:
dumpcap, which writes pcapng and stops at the size limit, or else tcpdump, which
writes pcap and, with ``-C``/``-W 1``, starts the file over when it is full. Each
capture runs in the network namespace of the node the interface belongs to (a
host's own, the root one for a switch), is listed in the run record, and is stopped
with SIGTERM (the tool then writes out what it holds) before the network goes; the
run's ``pcap/`` directory gets the files, ``captures.json`` (tool, limit, packets
captured and dropped per interface) and the QAINA Wireshark dissector. A node on
another server of a cluster is captured there (``remotecapture.py``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from ...p4.wireshark import FILE_NAME, dissector_lua
from ...settings import ConfigError

#: the tools in the order they are preferred
TOOLS = ("dumpcap", "tcpdump")
#: the kernel's capture buffer per interface (MiB): bursts of a run's agents fit
BUFFER_MB = 8
#: seconds the kernel may hold captured frames before dumpcap sees them (it reads
#: the capture ring in blocks that the kernel hands over after 250 ms at the latest;
#: tcpdump runs in immediate mode): a capture is stopped only after this
DRAIN_S = {"dumpcap": 0.6, "tcpdump": 0.1}
_COUNTS = {"dumpcap": (r"Packets captured: (\d+)", r"received/dropped on interface .*?: "
                       r"\d+/(\d+)"),
           "tcpdump": (r"(\d+) packets? captured", r"(\d+) packets? dropped by kernel")}


def topology_interfaces(topo) -> dict[str, list[str]]:
    """Node -> its interfaces, named as Mininet will name them (``<node>-eth<port>``),
    from a topology that is not built yet."""
    out: dict[str, list[str]] = {n: [] for n in topo.nodes()}
    for a, b, info in topo.links(withInfo=True):
        out[a].append(f"{a}-eth{info['port1']}")
        out[b].append(f"{b}-eth{info['port2']}")
    return out


def capturing(pid: int) -> bool:
    """Whether process ``pid`` holds a packet socket bound to an interface and running:
    from then on the kernel queues that interface's frames for it (the tools' own
    "Capturing on" lines come before they open the interface)."""
    inodes = set()
    try:
        for fd in os.scandir(f"/proc/{pid}/fd"):
            try:
                link = os.readlink(fd.path)
            except OSError:
                continue
            if link.startswith("socket:["):
                inodes.add(link[len("socket:["):-1])
        lines = open(f"/proc/{pid}/net/packet").read().splitlines()[1:]
    except OSError:
        return False
    # columns: sk RefCnt Type Proto Iface R Rmem User Inode
    return any(c[8] in inodes and c[4] != "0" and c[5] == "1"
               for c in (line.split() for line in lines) if len(c) >= 9)


def parse_names(text: str) -> list[str]:
    """The comma-separated names of ``--pcap``, in order, each once."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    return list(dict.fromkeys(names))


def find_tool() -> tuple[str, str]:
    """(tool, path) of the first capture tool installed; ConfigError if none is."""
    for tool in TOOLS:
        path = shutil.which(tool)
        if path:
            return tool, path
    raise ConfigError("--pcap needs a capture tool: apt-get install tcpdump "
                      "(or tshark, which brings dumpcap)")


@dataclass
class Capture:
    """One running capture: its interface, node, file, process and log."""

    interface: str
    node: str
    path: Path
    log: Path
    popen: subprocess.Popen | None = None
    server: str | None = None  # another server of a cluster, where it runs
    user: str = "root"
    remote_pid: int | None = None

    def counts(self, tool: str) -> dict:
        """Packets captured and dropped as the tool reported them on exit."""
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return {"captured": None, "dropped": None}
        found = [re.search(pattern, text) for pattern in _COUNTS[tool]]
        return {key: int(m.group(1)) if m else None
                for key, m in zip(("captured", "dropped"), found)}


@dataclass
class CapturePlan:
    """Which interfaces to capture, with which tool, up to what size."""

    interfaces: dict[str, str]  # interface -> its node
    tool: str
    tool_path: str
    limit_mb: int
    captures: list[Capture] = field(default_factory=list)

    @classmethod
    def resolve(cls, names: str, topo, limit_mb: int) -> "CapturePlan":
        """The plan for ``--pcap names`` on ``topo``; ConfigError naming the valid names
        when one is neither a node nor an interface, or when no tool is installed."""
        nodes = topology_interfaces(topo)
        owner = {i: n for n, intfs in nodes.items() for i in intfs}
        chosen: dict[str, str] = {}
        for name in parse_names(names):
            if name in nodes:
                chosen.update({i: name for i in nodes[name]})
            elif name in owner:
                chosen[name] = owner[name]
            else:
                raise ConfigError(
                    f"--pcap {name}: not a node or interface of this topology; nodes: "
                    f"{', '.join(sorted(nodes))}; interfaces: {', '.join(sorted(owner))}")
        if not chosen:
            raise ConfigError("--pcap: give node or interface names, e.g. --pcap h1,s1-eth1")
        tool, path = find_tool()
        return cls(chosen, tool, path, limit_mb)

    @property
    def suffix(self) -> str:
        return ".pcapng" if self.tool == "dumpcap" else ".pcap"

    def command(self, interface: str, path: Path) -> list[str]:
        """The tool's command line: whole frames, bounded to ``limit_mb`` (10^6 bytes)."""
        if self.tool == "dumpcap":
            return [self.tool_path, "-q", "-i", interface, "-s", "0", "-B", str(BUFFER_MB),
                    "-w", str(path), "-a", f"filesize:{self.limit_mb * 1000}"]
        return [self.tool_path, "-Z", "root", "-n", "-U", "--immediate-mode", "-s", "0",
                "-B", str(BUFFER_MB * 1024), "-i", interface, "-w", str(path),
                "-C", str(self.limit_mb), "-W", "1"]

    def start(self, net, out_dir: Path, log_dir: Path, record, timeout: float = 30.0):
        """Start a capture on every chosen interface of the built network ``net``, each
        in its node's namespace, recorded before the next one starts; returns once every
        tool says it is capturing."""
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / FILE_NAME).write_text(dissector_lua())
        record.data["captures"] = {"tool": self.tool, "limit_mb": self.limit_mb, "files": []}
        for interface, node_name in self.interfaces.items():
            node = net.get(node_name)
            path = (out_dir / f"{interface}{self.suffix}").resolve()
            log = log_dir / f"pcap-{interface}.log"
            cmd = self.command(interface, path)
            if getattr(node, "server_key", None) is not None:  # on another server
                capture = self._start_remote(node, interface, cmd, path, log, record)
            else:
                if node.inNamespace:  # a host: its namespace, through its shell's PID
                    cmd = ["mnexec", "-a", str(node.pid)] + cmd
                with open(log, "wb") as out:
                    popen = subprocess.Popen(cmd, stdout=out, stderr=out,
                                             stdin=subprocess.DEVNULL, start_new_session=True)
                capture = Capture(interface, node_name, path, log, popen)
                record.add_process(popen.pid, f"{self.tool} on {interface}")
            self.captures.append(capture)
            record.data["captures"]["files"].append(
                {"interface": interface, "node": node_name, "file": str(path),
                 "pid": capture.remote_pid or capture.popen.pid, "server": capture.server})
        self._wait_ready(timeout)

    def _start_remote(self, node, interface: str, cmd: list[str], path: Path, log: Path,
                      record) -> Capture:
        """A capture on the server of ``node`` (``remotecapture.py``), recorded there."""
        from .remotecapture import command
        node.rcmd(f"mkdir -p {path.parent}")  # the run's pcap/ there
        try:
            popen, pid, started = node.launch(command(cmd), log)
        except RuntimeError as exc:
            raise CaptureError(str(exc)) from None
        record.add_process(popen.pid, f"ssh to {self.tool} on {interface}")
        record.add_remote_process(node.server, node.user, pid, started,
                                  f"{self.tool} on {interface}")
        return Capture(interface, node.name, path, log, popen, node.server, node.user, pid)

    def _wait_ready(self, timeout: float):
        deadline = time.monotonic() + timeout
        waiting = [c for c in self.captures if c.server is None]
        while waiting:
            for c in list(waiting):
                # the file is made once the interface is open (a probe of it comes before)
                if c.path.exists() and capturing(c.popen.pid):
                    waiting.remove(c)
                elif c.popen.poll() is not None:
                    text = c.log.read_text(errors="replace") if c.log.exists() else ""
                    last = text.strip().splitlines()[-1:] or ["no output"]
                    raise CaptureError(f"{self.tool} on {c.interface} exited with "
                                       f"{c.popen.returncode}: {last[0]} (log {c.log})")
            if waiting and time.monotonic() > deadline:
                raise CaptureError(f"{self.tool} on {waiting[0].interface} did not start "
                                   f"capturing within {timeout:g} s (log {waiting[0].log})")
            time.sleep(0.02)
        remote = [c for c in self.captures if c.server is not None]
        if remote:
            from .remotecapture import wait_remote
            wait_remote(remote, self.tool, timeout)

    def _drain(self, running: list[Capture], most: float = 3.0):
        """Wait until the last frames have reached the tools: ``DRAIN_S``, then until
        no file grows any more (a busy machine schedules them late), at most ``most``."""
        time.sleep(DRAIN_S[self.tool])
        deadline, sizes = time.monotonic() + most, None
        while time.monotonic() < deadline:
            now = [c.path.stat().st_size if c.path.exists() else 0 for c in running]
            if now == sizes:
                return
            sizes = now
            time.sleep(0.2)

    def stop(self, out_dir: Path, wait: float = 5.0) -> list[dict]:
        """Stop every capture (SIGTERM: the tool writes out what it holds), make the
        files readable like the rest of the result set and write ``captures.json``;
        returns what each captured."""
        running = [c for c in self.captures if c.popen.poll() is None and c.server is None]
        remote = [c for c in self.captures if c.server is not None]
        if remote:  # drained and stopped on their servers
            from .remotecapture import stop_remote
            found = stop_remote(remote, self.tool, self.limit_mb)
        if running:
            self._drain(running)
        for c in running:
            c.popen.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + wait
        for c in running:
            try:
                c.popen.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                c.popen.kill()
                c.popen.wait()
        files = []
        for c in self.captures:
            if c.server is not None:
                try:
                    c.popen.wait(10)  # its ssh session ends with it
                except subprocess.TimeoutExpired:
                    c.popen.kill()
                    c.popen.wait()
                got = found.get(c.remote_pid) or {"bytes": None, "captured": None,
                                                  "dropped": None}
                size, counts = got["bytes"], {k: got[k] for k in ("captured", "dropped")}
            else:
                size = c.path.stat().st_size if c.path.exists() else None
                if size is not None:
                    os.chmod(c.path, 0o644)
                counts = c.counts(self.tool)
            files.append({"interface": c.interface, "node": c.node, "file": c.path.name,
                          "bytes": size, **counts,
                          "limit_reached": size is not None
                          and size >= self.limit_mb * 1_000_000,
                          **({"server": c.server} if c.server else {})})
        if self.captures:
            try:  # a full disk must not keep the network from being torn down
                (out_dir / "captures.json").write_text(json.dumps(
                    {"tool": self.tool, "limit_mb": self.limit_mb, "dissector": FILE_NAME,
                     "files": files}, indent=1))
            except OSError:
                pass
        return files


class CaptureError(RuntimeError):
    """A capture tool did not start; the message names the interface and its log."""
