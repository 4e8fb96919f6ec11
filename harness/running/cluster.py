"""One testbed network over several servers, with Mininet's cluster edition.

``--cluster SERVERS`` gives the servers: a comma list (``localhost,node2,node3``) or a
YAML file::

    user: root              # who ssh logs in as (default: root)
    servers: [localhost, node2, node3]
    pin: {sp1: node3}       # nodes placed by hand

The nodes are Mininet's cluster-edition nodes (``RemoteMixin``: a remote node's shell
is an ssh session to its server); links between servers are ``RemoteLink``'s ``ssh -w``
tunnels (layer 2 over ssh: the servers' sshd needs ``PermitTunnel yes``; no GRE, which
this project's kernels may lack). ``LeafPlacer`` keeps each switch that has hosts with
its hosts, so that only switch-to-switch links cross servers, and puts the switches
without hosts (spines) on the last server. Every server runs the project from the
same path (``sys.executable``) and keeps the run's directory at the same path on its
own disk (``rundir.py`` carries it back): a remote switch or agent is started there by
``python -m qaina_bench.harness.running.remote launch``, which reports its PID for the
run record.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from mininet.examples.cluster import Placer, RemoteLink, RemoteMixin
from mininet.link import TCIntf
from mininet.node import Host, Node

from ...settings import ConfigError
from ..config import MAX_YAML, parse_yaml, yaml_limit, yaml_problem
from ..results.resultset import read_text
from . import sshmux

LOCAL_NAMES = ("localhost", "127.0.0.1")
#: a server as ssh takes it: a host name, an ssh config alias, an IPv4 or IPv6 address
HOST_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,252}|[0-9A-Fa-f:]*:[0-9A-Fa-f:.]*")
USER_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9._-]{0,31}")
#: every ssh of a run gives up on a server that does not answer (frozen, cut off,
#: gone): a new connection after 5 s (its handshake included), an open one, a shared
#: one and every session through it after 4 x 5 s without an answer, so that no
#: command waits on such a server for ever
BOUNDED = ["-o", "ConnectTimeout=5", "-o", "ServerAliveInterval=5",
           "-o", "ServerAliveCountMax=4"]
SSH = ["ssh", "-o", "BatchMode=yes", *BOUNDED]


@dataclass(frozen=True)
class Server:
    """A machine of the cluster, reached by ssh as ``user``."""

    name: str
    user: str = "root"

    @property
    def local(self) -> bool:
        return self.name in LOCAL_NAMES

    def ssh(self, *cmd: str, lasting: bool = False) -> list[str]:
        """The command line that runs ``cmd`` on this server (as is when local),
        through the run's shared connections there when it has them (``sshmux.py``;
        ``lasting``: a session that stays open, not a short command)."""
        if self.local:
            return list(cmd)
        return (SSH + sshmux.options(self.user, self.name, lasting)
                + [f"{self.user}@{self.name}", " ".join(_quote(c) for c in cmd)])


def _quote(text: str) -> str:
    return shlex.quote(str(text))


@dataclass
class Cluster:
    """The servers of a run, in order, and the nodes pinned to one of them."""

    servers: list[Server]
    pins: dict[str, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str) -> "Cluster":
        """From ``--cluster``: a YAML file's path, or a comma list of servers."""
        if Path(text).is_dir():
            raise ConfigError(f"--cluster {text}: a directory, not a YAML file or a list "
                              "of servers")
        if Path(text).is_file():
            try:
                data = parse_yaml(read_text(Path(text), MAX_YAML)) or {}
            except (yaml.YAMLError, UnicodeDecodeError) as exc:
                problem = (yaml_problem(exc) if isinstance(exc, yaml.YAMLError)
                           else ": not UTF-8 text")
                raise ConfigError(f"--cluster {text}: not a YAML file{problem}")
            except OSError as exc:
                raise ConfigError(f"--cluster {text}: {exc.strerror or exc}")
            except (RecursionError, ValueError) as exc:  # too deep or large, a huge integer
                raise ConfigError(f"--cluster {text}: {yaml_limit(exc)}")
            if not isinstance(data, dict) or not isinstance(data.get("servers"), list):
                raise ConfigError(f"--cluster {text}: needs a list `servers:` of host names")
            unknown = sorted(map(str, set(data) - {"servers", "user", "pin"}))
            if unknown:
                raise ConfigError(f"--cluster {text}: unknown key(s) {', '.join(unknown)} "
                                  "(it takes servers, user and pin)")
            user = data.get("user", "root")
            if not isinstance(user, str) or not USER_NAME.fullmatch(user):
                raise ConfigError(f"--cluster {text}: user {user!r} is not a user name")
            pins = data.get("pin") or {}
            if not isinstance(pins, dict) or not all(
                    isinstance(k, str) and isinstance(v, str) for k, v in pins.items()):
                raise ConfigError(f"--cluster {text}: pin is a mapping of node names to "
                                  "servers (e.g. pin: {sp1: node3})")
            for name in data["servers"]:
                if not isinstance(name, str):
                    raise ConfigError(f"--cluster {text}: server {name!r} is not a host name")
            servers = [Server(name, user) for name in data["servers"]]
        elif text.endswith((".yaml", ".yml")):
            raise ConfigError(f"--cluster {text}: no such file")
        else:
            servers = [Server(s.strip()) for s in text.split(",") if s.strip()]
            pins = {}
        if not servers:
            raise ConfigError("--cluster: no servers given (e.g. --cluster localhost,node2)")
        for server in servers:
            if not HOST_NAME.fullmatch(server.name):
                raise ConfigError(f"--cluster: {server.name!r} is not a host name (a name "
                                  "or address as ssh takes it; a user, port or key go in "
                                  "~/.ssh/config, or user: in a cluster file)")
        names = [s.name for s in servers]
        if len(set(names)) != len(names):
            raise ConfigError(f"--cluster: a server is listed twice ({', '.join(names)})")
        if sum(s.local for s in servers) > 1:
            raise ConfigError(f"--cluster: {' and '.join(s.name for s in servers if s.local)} "
                              "both name this machine: list it once")
        for node, server in pins.items():
            if server not in names:
                raise ConfigError(f"--cluster: {node} is pinned to {server}, which is not "
                                  f"one of the servers ({', '.join(names)})")
        return cls(servers, pins)

    def names(self) -> list[str]:
        return [s.name for s in self.servers]

    def server(self, name: str) -> Server:
        return next(s for s in self.servers if s.name == name)

    @property
    def remote(self) -> list[Server]:
        return [s for s in self.servers if not s.local]


def place(cluster: Cluster, switches: list[str], hosts: list[str],
          links: list[tuple[str, str]]) -> dict[str, str]:
    """Node -> server. Switches with hosts (leaves) go round the servers (all but the
    last when there are more servers than one and switches without hosts); each host
    goes with its switch; switches without hosts (spines) go to the last server.
    Pinned nodes stay where they are pinned (a host pinned alone crosses servers)."""
    names = cluster.names()
    switch_of = {}
    for a, b in links:
        if a in hosts and b in switches:
            switch_of[a] = b
        elif b in hosts and a in switches:
            switch_of[b] = a
    edge = [s for s in switches if s in switch_of.values()]
    core = [s for s in switches if s not in edge]
    edge_servers = names[:-1] if len(names) > 1 and core else names
    out = dict(cluster.pins)
    free = [s for s in edge if s not in out]
    for k, sw in enumerate(free):
        out[sw] = edge_servers[k % len(edge_servers)]
    for sw in core:
        out.setdefault(sw, names[-1])
    for h in hosts:
        out.setdefault(h, out[switch_of[h]] if h in switch_of else names[0])
    return out


def host_servers(cluster: Cluster | None, topo) -> set[str] | None:
    """The servers ``place`` puts the hosts of ``topo`` on (None: no cluster)."""
    if cluster is None:
        return None
    where = place(cluster, topo.switches(), topo.hosts(), topo.links())
    return {where[h] for h in topo.hosts()}


class LeafPlacer(Placer):
    """Mininet's placer interface over ``place``; ``cluster`` is set by the testbed."""

    cluster: Cluster | None = None

    def __init__(self, *args, **kwargs):
        Placer.__init__(self, *args, **kwargs)
        self.placement = place(self.cluster, list(self.switches), list(self.hosts),
                               list(self.links))

    def place(self, node):
        return self.placement[node]


class ClusterNode(RemoteMixin):
    """Mininet's ``RemoteMixin`` for this project: no ``sudo`` when ssh logs in as
    root (a root run on root servers needs none, and minimal servers lack it)."""

    def _popen(self, cmd, sudo=True, tt=True, short=False, **params):
        """``RemoteMixin._popen`` without its Python ``preexec_fn`` (a fork of a process
        with gRPC threads must not run Python: a new session instead), and without
        ``sudo`` when ssh logs in as root (root servers need none, minimal ones lack it);
        through the run's shared connections to the server (``sshmux.py``; ``short``:
        a short command, not a lasting session)."""
        if isinstance(cmd, str):
            cmd = cmd.split()
        if self.isRemote:
            ssh = list(self.sshcmd)
            if ssh[:1] == ["sudo"]:
                ssh = ssh[4:]  # "sudo -E -u USER": ssh as ourselves
            if not tt:
                ssh.remove("-tt")
            ssh[-1:-1] = sshmux.options(self.user, self.server, lasting=not short) + BOUNDED
            if sudo and self.user != "root":
                cmd = ["sudo", "-E"] + cmd
            cmd = ssh + cmd
            params.setdefault("start_new_session", True)
        return Node._popen(self, cmd, **params)

    def finishInit(self):
        """The shell's PID: the last line of the answer to ``echo $$`` that is a number
        (a pty that echoed the command before ssh made it raw sent it back first)."""
        answer = self.waitOutput()
        numbers = re.findall(r"^\s*(\d+)\s*$", answer, re.M)
        if not numbers:
            raise ClusterError(f"{self.name} on {self.server}: no shell PID in {answer!r}")
        self.pid = int(numbers[-1])

    def rcmd(self, *cmd, **opts) -> str:
        """A command on this node's server, outside its namespace; its output as text."""
        popen = self.rpopen(*cmd, short=True, **opts)
        out, _ = popen.communicate()
        return out.decode(errors="replace") if isinstance(out, bytes) else (out or "")

    @property
    def server_key(self) -> str | None:
        """The server this node runs on, None when it is this machine."""
        return self.server if self.isRemote else None

    def launch(self, cmd: list[str], log: Path, env: dict | None = None):
        """Start ``cmd`` in this node's namespace on its server, its output to ``log``
        (the same path there); returns (the local ssh process, remote PID, its
        start time)."""
        popen = self.launch_begin(cmd, log, env)
        return (popen, *self.launch_end(popen, cmd[0]))

    def launch_begin(self, cmd: list[str], log: Path, env: dict | None = None):
        """``launch``'s first half: the local ssh process, the remote one starting
        (``launch_end`` waits for it: several can start at once)."""
        wrapped = remote_launch(log, cmd, env)
        # mnexec without -d: over ssh the command leads its process group, and
        # ``mnexec -d`` would fork and return at once
        return self.popen(wrapped, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, mncmd=["mnexec", "-a", str(self.pid)])

    def launch_forked(self, argv: list[str], log: Path, starter: str,
                      cgroups: list[str] = ()):
        """``launch_begin`` of an agent forked by the starter listening on ``starter``
        on this node's server (``remote launch --starter``): it runs ``argv`` in this
        node's namespaces (and cgroups ``cgroups`` there), its output to ``log``."""
        wrapped = [sys.executable, "-m", "qaina_bench.harness.running.remote", "launch",
                   "--log", str(log), "--starter", starter, "--ns-pid", str(self.pid),
                   *(["--cgroups", ",".join(cgroups)] if cgroups else []), "--"] + argv
        # outside the namespace: the starter's socket is in the server's own
        return self.popen(wrapped, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, mncmd=[])

    def launch_end(self, popen, what: str) -> tuple[int, float]:
        """The remote PID and start time of the process ``launch_begin`` started."""
        try:
            return launched(popen)
        except ValueError as exc:
            raise RuntimeError(f"starting {what} on {self.server} ({self.name}) failed: "
                               f"{exc}") from None

    def kill_remote(self, pid: int):
        """Stop remote process ``pid`` (TERM, then KILL after 3 s) on this node's server."""
        self.rcmd(stop_script(pid, 3))


def launched(popen) -> tuple[int, float]:
    """The PID and start time (there) that ``remote launch`` printed first on the
    output of ``popen`` (its ssh session); ValueError with what it printed instead,
    after killing the session."""
    line = popen.stdout.readline().decode(errors="replace").strip()
    try:
        info = json.loads(line)
        return int(info["pid"]), float(info["started"])
    except (ValueError, KeyError, TypeError):
        popen.kill()
        rest = line or popen.stdout.read().decode(errors="replace")[-300:].strip()
        raise ValueError(rest or "no answer") from None


def remote_launch(log: Path, cmd: list[str], env: dict | None = None) -> list[str]:
    """``remote launch`` of ``cmd`` (with ``env`` added), its output to ``log``."""
    env_words = [f"{k}={v}" for k, v in (env or {}).items()]
    return ([sys.executable, "-m", "qaina_bench.harness.running.remote", "launch",
             "--log", str(log), "--"] + (["env"] + env_words if env_words else []) + cmd)


def stop_script(pid: int, grace: float) -> str:
    """A shell line that stops process ``pid``: TERM, then KILL after ``grace`` s."""
    return (f"kill {pid} 2>/dev/null; for i in $(seq {round(grace * 10)}); do kill -0 "
            f"{pid} 2>/dev/null || exit 0; sleep 0.1; done; kill -9 {pid} 2>/dev/null; true")


def each_then_first_failure(steps) -> None:
    """Run every step (a callable) even when one fails; then raise the first
    ``RuntimeError`` any raised. Remote processes started at once are each read this way,
    so that none is left unrecorded behind a failed one."""
    failed = []
    for step in steps:
        try:
            step()
        except RuntimeError as exc:
            failed.append(exc)
    if failed:
        raise failed[0]


class ClusterHost(ClusterNode, Host):
    """A Mininet host on a server of the cluster."""


class ClusterError(OSError):
    """A server of the cluster did not do what the network needs (one line)."""


class RemoteTCLink(RemoteLink):
    """``RemoteLink`` with ``TCLink``'s shaped interfaces (--bw, --delay, --loss), and
    its ssh tunnel made as Mininet's cluster edition makes it (a tap device on each
    server, ``ssh -o Tunnel=Ethernet -w 9:9``, moved and renamed), with ssh's output
    read as text (the PyPI release compares bytes with str there)."""

    def __init__(self, node1, node2, **kwargs):
        kwargs.setdefault("cls1", TCIntf)
        kwargs.setdefault("cls2", TCIntf)
        RemoteLink.__init__(self, node1, node2, **kwargs)

    def makeTunnel(self, node1, node2, intfname1, intfname2, addr1=None, addr2=None):
        if node2.server == "localhost":  # ssh goes from here to the other server
            return self.makeTunnel(node2, node1, intfname2, intfname1, addr2, addr1)
        for node in (node1, node2):
            out = node.rcmd(f"ip tuntap add dev tap9 mode tap user {node.user}")
            if out.strip():
                raise ClusterError(f"{node.server}: cannot make a tap device for "
                                   f"{intfname1}: {out.strip()[-200:]}")
        # a connection of its own: a tunnel is not forwarded through a shared one
        # (ControlPath=none also overrides an ~/.ssh/config that shares connections)
        cmd = ["ssh", "-n", "-o", "BatchMode=yes", "-o", "ControlPath=none", *BOUNDED,
               "-o", "Tunnel=Ethernet", "-w", "9:9", f"{node2.user}@{node2.serverIP}",
               "echo @"]
        self.cmd = cmd
        tunnel = node1.rpopen(cmd, sudo=False)
        first = tunnel.stdout.read(1).decode(errors="replace")
        if first != "@":
            rest = tunnel.stdout.read().decode(errors="replace")
            raise ClusterError(f"ssh tunnel {node1.server} to {node2.server} for "
                               f"{intfname1}-{intfname2} failed (PermitTunnel yes on "
                               f"{node2.server}?): {(first + rest).strip()[-200:]}")
        for node, name, addr in ((node1, intfname1, addr1), (node2, intfname2, addr2)):
            self.moveIntf("tap9", node)
            out = node.cmd("ip link set tap9 name", name, *(["address", addr] if addr else []))
            if out.strip():
                raise ClusterError(f"{node.server}: renaming tap9 to {name}: {out.strip()}")
        return tunnel


def run_remote(server: Server, args: list[str], stdin: str = "",
               timeout: float = 60) -> subprocess.CompletedProcess:
    """``python -m qaina_bench.harness.running.remote ARGS`` on ``server``."""
    cmd = server.ssh(sys.executable, "-m", "qaina_bench.harness.running.remote", *args)
    return subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=timeout)


def remote_resources(server: Server, action: str, entry: dict) -> list[str]:
    """Run a run record's ``action`` ("remove" or "leftovers") on ``server`` for what it
    lists there; returns its lines (or one saying the server did not answer)."""
    try:
        res = run_remote(server, [action], json.dumps(entry))
    except (OSError, subprocess.TimeoutExpired) as exc:
        return [f"{server.name}: not reached ({exc})"]
    if res.returncode != 0:
        said = ((res.stderr or res.stdout).strip().splitlines() or ["no output"])[-1][-200:]
        how = "not reached" if res.returncode == 255 else f"{action} failed there"
        return [f"{server.name}: {how} ({said})"]
    return [f"{server.name}: {line}" for line in res.stdout.splitlines() if line.strip()]


def agent_environment() -> dict:
    """What ``agent_env`` adds, given to a remote agent on its command line."""
    return {var: "1" for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")}
