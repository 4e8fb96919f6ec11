"""Whether the servers of ``--cluster`` can take a run: ``qaina-bench doctor --cluster``
and ``up --cluster`` ask every server, in one ssh session each, whether it is reached
by ssh without a password, as root, with Mininet, a tun device and an sshd that allows
tunnels, nft (a switch there has its P4Runtime port guarded by an nftables table),
and the project (the same version, at the same path as here); with ``--target bmv2``
also whether ``simple_switch_grpc`` is on PATH there and runs, with
``simple_switch_CLI`` beside it, and p4c there when this machine has none (it compiles
the program then); with ``--pcap``, whether this machine's capture tool is there
(``doctor`` says whether any is); with ``--train-script``, whether PyTorch is in the
project's environment on each server that has worker hosts (``doctor``: on each). ``local_bmv2_check``: this machine needs BMv2 and
nft only when a switch of the run is placed here."""

from __future__ import annotations

import shutil
import subprocess
import sys
import uuid
from concurrent.futures import ThreadPoolExecutor
from importlib.metadata import version
from pathlib import Path

from ...settings import ConfigError
from ...hosts.models import TORCH_HINT
from .cluster import Cluster, Server, host_servers, place, run_remote

PROBE = ("echo uid=$(id -u); echo mnexec=$(command -v mnexec); "
         "echo tun=$(test -c /dev/net/tun && echo yes); "
         "echo tunnel=$(sshd -T 2>/dev/null | sed -n 's/^permittunnel //p'); "
         "echo nft=$(command -v nft); "
         "echo dumpcap=$(command -v dumpcap); echo tcpdump=$(command -v tcpdump); "
         "echo version=$({python} -m qaina_bench.harness.running.remote version 2>/dev/null); "
         "echo torch=$({python} -c 'import importlib.util as u; "
         "print(\"yes\" if u.find_spec(\"torch\") else \"\")' 2>/dev/null)"
         "{bmv2}")
# BMv2 asked for (--target bmv2): where simple_switch_grpc is, and its --version's first
# line or, when it does not run (a library missing), the first line of its error
BMV2_PROBE = ("; echo bmv2=$(command -v simple_switch_grpc); "
              "echo bmv2run=$(simple_switch_grpc --version 2>&1 | head -n 1); "
              "echo bmv2ok=$(simple_switch_grpc --version >/dev/null 2>&1 && echo yes); "
              "echo bmv2cli=$(command -v simple_switch_CLI); echo p4c=$(command -v p4c)")


def bmv2_checks(name: str, facts: dict) -> list[tuple[str, bool, str]]:
    """(what, ok, how to fix) for BMv2 on server ``name``, from what it said."""
    where = f"{name}:"
    here = shutil.which("p4c") is not None
    if not facts.get("bmv2"):
        return [(f"{where} BMv2", False, "simple_switch_grpc not on PATH there: install "
                 "BMv2 there, or use --target embedded")]
    if facts.get("bmv2ok") != "yes":
        return [(f"{where} BMv2", False, f"{facts['bmv2']} does not run there "
                 f"(`simple_switch_grpc --version`: {facts.get('bmv2run') or 'no output'})")]
    return [(f"{where} BMv2 {facts.get('bmv2run', '')}".rstrip(), True, ""),
            (f"{where} simple_switch_CLI", bool(facts.get("bmv2cli")),
             "simple_switch_CLI not on PATH there (BMv2's Thrift CLI: registers, resets)"),
            (f"{where} p4c" + (" (not needed: this machine has p4c)" if here else ""),
             bool(facts.get("p4c")) or here,
             "p4c is on PATH neither there nor here: it compiles the program for BMv2 "
             "(here, or on the switch's server when this machine has none)")]


def probe(server: Server, timeout: float = 20, bmv2: bool = False) -> dict | str:
    """What ``server`` says about itself (about BMv2 too with ``bmv2``), or why it
    did not answer (one line)."""
    script = PROBE.format(python=sys.executable, bmv2=BMV2_PROBE if bmv2 else "")
    try:
        res = subprocess.run(server.ssh("sh", "-c", script),
                             capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"no answer by ssh within {timeout:.0f} s"
    except OSError as exc:
        return f"ssh cannot run here ({exc.strerror})"
    if res.returncode == 255 or "uid=" not in res.stdout:
        why = (res.stderr.strip().splitlines() or ["ssh failed"])[-1]
        return f"not reachable by ssh as {server.user} ({why})"
    return dict(line.split("=", 1) for line in res.stdout.splitlines() if "=" in line)


def capture_check(name: str, facts: dict, tool: str | None) -> tuple[str, bool, str]:
    """(what, ok, how to fix) for ``--pcap`` on server ``name``: ``tool`` (what captures
    here) there; without one, either capture tool (optional: doctor)."""
    if tool is None:
        return (f"{name}: dumpcap or tcpdump (optional: --pcap)",
                bool(facts.get("dumpcap") or facts.get("tcpdump")),
                "no capture tool there: apt-get install tshark (or tcpdump) there")
    return (f"{name}: {tool} (--pcap)", bool(facts.get(tool)),
            f"--pcap captures with {tool}, which is not on PATH there: apt-get install "
            f"{'tshark' if tool == 'dumpcap' else tool} there")


def torch_check(name: str, facts: dict, needed: bool) -> tuple[str, bool, str]:
    """(what, ok, how to fix) for PyTorch on server ``name``: ``needed`` where a
    ``--train-script`` runs on hosts there, optional otherwise (doctor)."""
    return (f"{name}: PyTorch " + ("(--train-script: hosts there run the script)" if needed
                                   else "(optional: --train-script)"),
            facts.get("torch") == "yes",
            f"--train-script needs PyTorch there, in the project's environment at "
            f"{sys.executable}: {TORCH_HINT}")


def check_server(server: Server, target: str = "embedded",
                 capture_tool: str | None = None,
                 torch: bool = False) -> list[tuple[str, bool, str]]:
    """(what, ok, how to fix) for each requirement ``server`` must meet (``capture_tool``:
    ``--pcap``'s tool, needed there; ``torch``: PyTorch needed there)."""
    where = f"{server.name}:"
    if server.local:
        return [(f"{where} this machine", True, "")]
    facts = probe(server, bmv2=target == "bmv2")
    if isinstance(facts, str):
        return [(f"{where} ssh", False, f"{facts}; set up key login (README \"Running on a "
                 "cluster\")")]
    ours = version("qaina-bench")
    out = [(f"{where} ssh as {server.user}", True, ""),
           (f"{where} root", facts.get("uid") == "0",
            f"ssh logs in as uid {facts.get('uid')}: log in as root (user: root)"),
           (f"{where} Mininet", bool(facts.get("mnexec")),
            "mnexec not found: apt-get install mininet there"),
           (f"{where} /dev/net/tun", facts.get("tun") == "yes",
            "no /dev/net/tun: the ssh tunnels between servers need it"),
           (f"{where} sshd PermitTunnel", facts.get("tunnel") in ("yes", "ethernet"),
            f"sshd has PermitTunnel {facts.get('tunnel') or 'unknown'}: set "
            "`PermitTunnel yes` in its sshd_config (links between servers are ssh -w tunnels)"),
           (f"{where} nft", bool(facts.get("nft")),
            "nft not found: apt-get install nftables there (it keeps a switch's P4Runtime "
            "port there for this machine and loopback, and BMv2's Thrift port for loopback)"),
           (f"{where} qaina-bench {ours} at {sys.executable}", facts.get("version") == ours,
            (f"it has qaina-bench {facts['version']}: install the same version"
             if facts.get("version") else
             f"no qaina-bench at {sys.executable}: install the project at the same path"))]
    if target == "bmv2":
        out += bmv2_checks(server.name, facts)
    return out + [capture_check(server.name, facts, capture_tool),
                  torch_check(server.name, facts, torch)]


def shared_directory(server: Server, directory: Path) -> bool:
    """Whether ``server`` sees ``directory`` as this machine does (a file made here is
    there)."""
    directory.mkdir(parents=True, exist_ok=True)
    probe_file = directory / f".cluster-probe-{uuid.uuid4().hex[:8]}"
    probe_file.write_text("")
    try:
        res = subprocess.run(server.ssh("test", "-f", str(probe_file)), capture_output=True,
                             timeout=20)
        return res.returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False
    finally:
        probe_file.unlink(missing_ok=True)


def cpu_limit_problem(server: Server) -> str | None:
    """Why hosts cannot be CPU-limited on ``server`` (``cpulimit.limit_problem`` there),
    in one line; None when they can."""
    try:
        res = run_remote(server, ["cpulimit"], timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"not reached ({exc})"
    said = (res.stdout.strip() or res.stderr.strip()).splitlines()
    return (said[-1] if said else None) if res.returncode == 0 else \
        f"cannot say whether hosts can be CPU-limited there: {said[-1] if said else '?'}"


def cluster_for(text: str | None, target: str, host_cpu: float | None = None,
                pcap: bool = False, script_topo=None) -> Cluster | None:
    """The run's cluster, every server checked; ConfigError with the first problem.
    ``pcap``: ``--pcap`` given (its tool needed on every server); ``script_topo``:
    with ``--train-script``, the run's topology (PyTorch needed where its hosts are)."""
    if not text:
        return None
    cluster = Cluster.parse(text)
    torch_on = host_servers(cluster, script_topo) if script_topo is not None else set()
    tool = None
    if pcap and cluster.remote:
        from .capture import find_tool
        tool = find_tool()[0]
    with ThreadPoolExecutor(max(1, len(cluster.remote))) as pool:  # every server at once
        checked = list(pool.map(lambda server: check_server(server, target, tool,
                                                            server.name in torch_on),
                                cluster.remote))
    for server, checks in zip(cluster.remote, checked):
        for what, ok, fix in checks:
            if not ok and "(optional" not in what:
                raise ConfigError(f"--cluster: {server.name}: {fix}")
        problem = cpu_limit_problem(server) if host_cpu else None
        if problem:
            raise ConfigError(f"--cluster: {server.name}: {problem}")
    return cluster


def local_bmv2_check(cluster: Cluster | None, topo):
    """ConfigError when a switch of ``topo`` is placed on this machine (every switch
    without ``--cluster``) and this machine lacks BMv2, p4c or nft; with every switch
    on other servers, their checks (``bmv2_checks``) stand for it."""
    switches = topo.switches()
    if cluster is not None:
        where = place(cluster, switches, topo.hosts(), topo.links())
        switches = [s for s in switches if Server(where[s]).local]
    if not switches:
        return
    from ..switches.targets import bmv2_missing
    from .linkloss import nft_available
    if bmv2_missing():
        raise ConfigError(f"--target bmv2: {bmv2_missing()} (switch {switches[0]} runs here)")
    if not nft_available():
        raise ConfigError("--target bmv2 needs nftables to keep BMv2's Thrift port "
                          "(open on every address) for loopback only: "
                          "apt-get install nftables")
