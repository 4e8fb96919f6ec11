"""``--cluster``: the servers' list and YAML file, the placement (each leaf with its
hosts, spines on the last server, pins), ``doctor --cluster``'s one-line answers about
a server that cannot take a run, and a run on a cluster of one (``localhost``) as root:
exact sums, and nothing left, as a plain run."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from qaina_bench.harness.cli import main
from qaina_bench.harness.running.cluster import (Cluster, Server, each_then_first_failure,
                                                host_servers, place)
from qaina_bench.harness.running.run import build_topology
from qaina_bench.harness.config import RunConfig
from qaina_bench.settings import ConfigError
from testbed_lab import check_exact_aggregates, execute


def test_a_comma_list_and_a_yaml_file_give_the_servers(tmp_path):
    assert Cluster.parse("localhost, n2,n3").names() == ["localhost", "n2", "n3"]
    spec = tmp_path / "cluster.yaml"
    spec.write_text("user: admin\nservers: [localhost, n2]\npin: {sp1: n2}\n")
    cluster = Cluster.parse(str(spec))
    assert cluster.servers == [Server("localhost", "admin"), Server("n2", "admin")]
    assert cluster.pins == {"sp1": "n2"}
    assert Server("n2", "admin").ssh("true")[-2:] == ["admin@n2", "true"]
    assert Server("localhost").ssh("true") == ["true"]




@pytest.mark.root
def test_a_master_that_does_not_come_up_leaves_commands_on_their_own_and_nothing_behind(
        dead_address, tmp_path):
    """No master (ssh refused): the server is named, commands connect on their own;
    the master's ssh and its socket's directory are in the record, kept past the
    teardown's check of what is left, until ``stop`` removes them."""
    from qaina_bench.harness.running import sshmux
    from qaina_bench.harness.running.cluster import SSH
    from qaina_bench.harness.running.record import RunRecord
    rec = RunRecord("sshmux-test", tmp_path)
    masters = sshmux.Masters([Server(dead_address)], rec, SSH)
    try:
        assert masters.start(timeout=0.5) == [f"{dead_address} (no answer)"]
        assert sshmux.options("root", dead_address) == []
        directory = masters.directory
        master = next(p for p in rec.data["processes"] if "master" in p["what"])
        assert rec.data["held_to_the_end"] == [
            f"temporary directory {directory}",
            f"process ssh master connection to {dead_address} ({master['pid']})"]
        assert rec.leftovers(wait=0, but_last=True) == []
        assert rec.leftovers(wait=0) == [f"temporary directory {directory}"]
    finally:
        masters.stop()
    assert not Path(directory).exists() and rec.leftovers(wait=0) == []


def test_clean_removes_what_a_run_holds_to_its_end(tmp_path):
    """After a kill -9 the record's last entries (a master's ssh, its directory) go
    like the others."""
    from qaina_bench.harness.running.record import RunRecord
    rec = RunRecord("held-test", tmp_path)
    proc = subprocess.Popen(["sleep", "60"])
    held = tmp_path / "held"
    held.mkdir()
    rec.add_process(proc.pid, "ssh master connection to n2", last=True)
    rec.add_temp_directory(held, last=True)
    assert rec.leftovers(wait=0, but_last=True) == []
    done = rec.remove_resources()
    assert proc.wait(5) is not None and not held.exists(), done
    assert any("ssh master connection to n2" in line for line in done)


@pytest.mark.parametrize("text, says", [(",", "no servers"), ("a,b,a", "listed twice"),
                                        ("nowhere.yaml", "no such file")])
def test_a_bad_server_list_is_one_clear_error(text, says):
    with pytest.raises(ConfigError, match=says):
        Cluster.parse(text)


def test_a_pin_to_an_unknown_server_is_refused(tmp_path):
    spec = tmp_path / "c.yaml"
    spec.write_text("servers: [a, b]\npin: {sp1: c}\n")
    with pytest.raises(ConfigError, match="sp1 is pinned to c"):
        Cluster.parse(str(spec))


def test_remote_starts_are_all_read_before_the_first_failure_is_raised():
    """A remote process that failed to start must not leave the ones after it
    unrecorded (their PIDs unread): every start is read, then the first failure goes."""
    read = []

    def start(name, fails):
        def step():
            read.append(name)
            if fails:
                raise RuntimeError(f"starting {name} failed")
        return step

    with pytest.raises(RuntimeError, match="starting b failed"):
        each_then_first_failure([start("a", False), start("b", True), start("c", True),
                                 start("d", False)])
    assert read == ["a", "b", "c", "d"]
    each_then_first_failure([start("e", False)])
    assert read[-1] == "e"


def placement(servers: str, **kw):
    topo = build_topology(RunConfig.flat(topo="leafspine", jobs=2, workers=4, **kw))
    return place(Cluster.parse(servers), topo.switches(), topo.hosts(), topo.links())


def test_each_leaf_goes_with_its_hosts_and_the_spines_go_to_the_last_server():
    where = placement("a,b,c")
    assert where["lf1"] == "a" and where["lf2"] == "b"
    assert where["sp1"] == where["sp2"] == "c"
    for h in (f"h{i}" for i in range(1, 9)):  # h1 on lf1, h2 on lf2, ...
        assert where[h] == ("a" if int(h[1:]) % 2 else "b")


def test_agents_starters_go_only_to_the_servers_with_hosts(tmp_path):
    topo = build_topology(RunConfig.flat(topo="leafspine", jobs=2, workers=4))
    assert host_servers(Cluster.parse("a,b,c"), topo) == {"a", "b"}  # c: the spines
    spec = tmp_path / "c.yaml"
    spec.write_text("servers: [a, b, c]\npin: {h3: c}\n")
    assert host_servers(Cluster.parse(str(spec)), topo) == {"a", "b", "c"}
    assert host_servers(None, topo) is None


def test_on_one_server_everything_is_there_and_pins_win(tmp_path):
    assert set(placement("localhost").values()) == {"localhost"}
    spec = tmp_path / "c.yaml"
    spec.write_text("servers: [a, b, c]\npin: {lf2: a, sp2: b}\n")
    where = placement(str(spec))
    assert where["lf2"] == "a" and where["h2"] == "a" and where["sp2"] == "b"
    assert where["sp1"] == "c"


@contextlib.contextmanager
def veth_namespace(ns: str, here: str, there: list[str], prefix: int):
    """A namespace ``ns`` with the addresses ``there``, reaching this machine's ``here``
    over a veth pair (all in a /``prefix`` of their own); removed afterwards."""
    cmds = [f"ip netns add {ns}", f"ip link add {ns}a type veth peer name {ns}b",
            f"ip link set {ns}b netns {ns}", f"ip addr add {here}/{prefix} dev {ns}a",
            f"ip link set {ns}a up"]
    cmds += [f"ip -n {ns} addr add {a}/{prefix} dev {ns}b" for a in there]
    cmds += [f"ip -n {ns} link set {ns}b up", f"ip -n {ns} link set lo up"]
    try:
        for c in cmds:
            subprocess.run(c.split(), check=True, capture_output=True)
        yield
    finally:
        subprocess.run(["ip", "link", "del", f"{ns}a"], capture_output=True)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


@pytest.fixture
def dead_address():
    """An address of a namespace this test makes, where nothing listens (no ssh)."""
    with veth_namespace(f"qbcl{os.getpid() % 10000}", "10.213.7.1", ["10.213.7.2"], 30):
        yield "10.213.7.2"


@pytest.mark.root
def test_doctor_says_in_one_line_that_a_server_is_not_reachable(dead_address):
    res = CliRunner().invoke(main, ["doctor", "--cluster", f"localhost,{dead_address}"])
    assert res.exit_code == 1
    bad = [line for line in res.output.splitlines()
           if line.startswith("NO ") and dead_address in line]
    assert len(bad) == 1 and "not reachable by ssh as root" in bad[0], res.output
    assert "Traceback" not in res.output


@pytest.mark.root
def test_doctor_target_bmv2_on_a_cluster_without_this_machine_leaves_bmv2_here_optional(
        dead_address, monkeypatch):
    """No switch can run here when this machine is not a server: its BMv2 and p4c are
    optional; the server that is not reached is the one failure."""
    tools = ("simple_switch_grpc", "p4c")  # missing here: PATH without their directories
    monkeypatch.setenv("PATH", ":".join(d for d in os.environ["PATH"].split(":")
                                        if not any(os.path.exists(f"{d}/{t}") for t in tools)))
    res = CliRunner().invoke(main, ["doctor", "--target", "bmv2", "--cluster", dead_address])
    lines = res.output.splitlines()
    assert res.exit_code == 1 and "Traceback" not in res.output
    assert [line for line in lines if line.startswith("NO ")] == \
        [line for line in lines if line.startswith(f"NO  {dead_address}: ssh")], res.output
    for tool in tools:
        assert any(line.startswith(f"--  {tool} (optional: this machine is not a server")
                   for line in lines), res.output


@pytest.mark.root
@pytest.mark.parametrize("options", [[], ["--train-script", __file__], ["--cli"]])
def test_up_refuses_an_unreachable_server_in_one_line(dead_address, tmp_path, options):
    if "--train-script" in options and importlib.util.find_spec("torch") is None:
        pytest.skip("--train-script needs PyTorch here (make venv installs its CPU build)")
    res = CliRunner().invoke(main, ["up", "--cluster", f"localhost,{dead_address}",
                                    "--results-dir", str(tmp_path)] + options)
    assert res.exit_code != 0 and "Traceback" not in res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and f"--cluster: {dead_address}: not reachable by ssh as root" in lines[0]


@pytest.mark.root
@pytest.mark.skipif(shutil.which("mnexec") is None, reason="mnexec missing")
def test_a_cluster_of_one_runs_as_a_plain_run(tmp_path, record_dir):
    summary, directory = execute(tmp_path, topo="leafspine", jobs=2, workers=2, bits=[4],
                                 iterations=2, cluster="localhost")
    assert summary["complete"]
    check_exact_aggregates(directory, summary)
    where = json.loads((directory / "logs" / "placement.json").read_text())
    assert set(where.values()) == {"localhost"} and len(where) == 8
    assert not list(record_dir.glob("*.json"))  # torn down: the record is gone
    left = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    assert not [n for n in ("lf1-eth1", "sp1-eth1") if f" {n}@" in left or f" {n}:" in left]


def test_a_records_part_on_a_server_is_removed_there_by_the_remote_helper(tmp_path):
    """What a record lists under a server goes through ``python -m ...remote remove``
    there (here the server is this machine, reached without ssh): its process is
    stopped, ``leftovers`` lists it before and not after."""
    import subprocess as sp
    from qaina_bench.harness.running.record import RunRecord, _start_time
    proc = sp.Popen(["sleep", "60"], start_new_session=True)
    try:
        rec = RunRecord("cluster-part", tmp_path)
        rec.add_remote_process("localhost", "root", proc.pid, _start_time(proc.pid),
                               "agent j1w0 on h3")
        assert any("localhost: process agent j1w0 on h3" in x
                   for x in rec.leftovers(wait=0))
        done = rec.remove_resources()
        assert f"localhost: stopped agent j1w0 on h3 (pid {proc.pid})" in done
        proc.wait(5)
        assert rec.leftovers(wait=0) == []
    finally:
        if proc.poll() is None:
            proc.kill()


def bmv2_facts(path: str) -> dict:
    """What the probe that ``doctor --cluster --target bmv2`` runs on a server says,
    run on this machine with ``path`` as PATH."""
    import os
    from qaina_bench.harness.running.clustercheck import probe
    old = os.environ["PATH"]
    os.environ["PATH"] = path
    try:
        facts = probe(Server("localhost"), bmv2=True)
    finally:
        os.environ["PATH"] = old
    assert isinstance(facts, dict), facts
    return facts


def test_doctor_and_up_say_in_one_line_that_a_server_has_no_capture_tool(tmp_path):
    import os
    from qaina_bench.harness.running.clustercheck import capture_check, probe
    for tool in ("sh", "id", "sed"):  # what the probe runs, and no capture tool
        (tmp_path / tool).symlink_to(shutil.which(tool))
    old = os.environ["PATH"]
    os.environ["PATH"] = str(tmp_path)
    try:
        facts = probe(Server("localhost"))
    finally:
        os.environ["PATH"] = old
    assert isinstance(facts, dict) and "tcpdump" in facts and not facts["tcpdump"]
    what, ok, fix = capture_check("node2", facts, None)  # doctor: optional
    assert "(optional: --pcap)" in what and not ok and "no capture tool there" in fix
    what, ok, fix = capture_check("node2", facts, "tcpdump")  # up --pcap: needed
    assert what == "node2: tcpdump (--pcap)" and not ok
    assert fix == "--pcap captures with tcpdump, which is not on PATH there: apt-get " \
                  "install tcpdump there"
    found = probe(Server("localhost"))
    assert capture_check("node2", found, None)[1] == bool(shutil.which("dumpcap")
                                                          or shutil.which("tcpdump"))


def test_doctor_says_in_one_line_that_a_server_has_no_bmv2():
    from qaina_bench.harness.running.clustercheck import bmv2_checks
    checks = bmv2_checks("node2", bmv2_facts("/usr/bin:/bin"))
    assert [(what, ok) for what, ok, _ in checks] == [("node2: BMv2", False)]
    assert "simple_switch_grpc not on PATH there" in checks[0][2]


def test_doctor_says_that_a_bmv2_that_cannot_load_its_libraries_does_not_run(tmp_path):
    from qaina_bench.harness.running.clustercheck import bmv2_checks
    fake = tmp_path / "simple_switch_grpc"  # fails as the loader does without a library
    fake.write_text("#!/bin/sh\necho 'simple_switch_grpc: error while loading shared "
                    "libraries: libbmpi.so.0: cannot open shared object file' >&2\nexit 127\n")
    fake.chmod(0o755)
    checks = bmv2_checks("node2", bmv2_facts(f"{tmp_path}:/usr/bin:/bin"))
    assert len(checks) == 1 and not checks[0][1]
    assert f"{fake} does not run there" in checks[0][2]
    assert "libbmpi.so.0" in checks[0][2]


@pytest.mark.skipif(shutil.which("simple_switch_grpc") is None,
                    reason="simple_switch_grpc not on PATH")
def test_doctor_gives_the_version_of_a_bmv2_that_runs():
    import os
    from qaina_bench.harness.running.clustercheck import bmv2_checks
    checks = bmv2_checks("node2", bmv2_facts(os.environ["PATH"]))
    version = subprocess.run(["simple_switch_grpc", "--version"], capture_output=True,
                             text=True).stdout.strip().splitlines()[0]
    assert checks[0] == (f"node2: BMv2 {version}", True, "")
    assert [ok for _, ok, _ in checks[1:]] == [shutil.which("simple_switch_CLI") is not None,
                                              shutil.which("p4c") is not None]
    assert checks[2][0].startswith("node2: p4c")


@pytest.mark.root
@pytest.mark.skipif(shutil.which("nft") is None, reason="nft missing")
def test_a_remote_thrift_guard_is_made_on_its_server_and_removed_there_by_the_record(
        tmp_path):
    """The guard of a remote BMv2's Thrift port is made through the server's shell
    (here this machine, reached without ssh), listed under the server in the record,
    and removed there by ``remote remove``."""
    from qaina_bench.harness.running.record import RunRecord
    from qaina_bench.harness.running.remotebmv2 import RemoteThriftGuard
    from qaina_bench.harness.switches.firewall import table_exists
    guard = RemoteThriftGuard(1, Server("localhost"))  # port 1: nothing listens there
    rec = RunRecord("cluster-guard", tmp_path)
    rec.add_remote_nft_table("localhost", "root", guard.family, guard.table)
    try:
        guard.close_port()
        assert guard.exists() and table_exists(guard.family, guard.table)
        assert f"localhost: nftables table inet {guard.table}" in rec.leftovers(wait=0)
        assert f"localhost: deleted nftables table inet {guard.table}" in \
            rec.remove_resources()
        assert not guard.exists() and rec.leftovers(wait=0) == []
    finally:
        guard.remove()


def test_a_server_without_nft_refuses_a_remote_bmv2_in_one_line(monkeypatch):
    from qaina_bench.harness.running.remotebmv2 import RemoteThriftGuard
    from qaina_bench.harness.switches.firewall import FirewallError
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # nft is in /usr/sbin
    with pytest.raises(FirewallError, match=r"^localhost has no nft: BMv2 there needs it"):
        RemoteThriftGuard(1, Server("localhost")).close_port()
    from qaina_bench.harness.running.remoteguard import RemoteP4RuntimeGuard
    with pytest.raises(FirewallError, match=r"^localhost has no nft: a switch there needs it "
                       r"to keep its P4Runtime port"):
        RemoteP4RuntimeGuard(1, "10.0.0.1", Server("localhost")).close_port()


def test_the_harness_address_is_the_ssh_client_address_the_server_sees(monkeypatch):
    """``$SSH_CONNECTION`` read on the server (here this machine, its shell given the
    variable); without one the answer is one line."""
    from qaina_bench.harness.running.remoteguard import harness_address
    from qaina_bench.harness.switches.firewall import FirewallError
    monkeypatch.setenv("SSH_CONNECTION", "10.213.9.2 40222 10.213.9.1 22")
    assert harness_address(Server("localhost")) == "10.213.9.2"
    monkeypatch.setenv("SSH_CONNECTION", "fd00::2 40222 fd00::1 22")
    assert harness_address(Server("localhost")) == "fd00::2"
    monkeypatch.delenv("SSH_CONNECTION")
    with pytest.raises(FirewallError, match=r"^localhost did not tell the address"):
        harness_address(Server("localhost"))


@pytest.fixture
def two_clients():
    """A namespace with two addresses, 10.213.9.2 and .3, reaching this machine's
    10.213.9.1 over a veth pair; yields (namespace, this machine's address)."""
    ns = f"qbgd{os.getpid() % 10000}"
    with veth_namespace(ns, "10.213.9.1", ["10.213.9.2", "10.213.9.3"], 29):
        yield ns, "10.213.9.1"


def connects(ns: str | None, source: str | None, address: str, port: int) -> bool:
    """Whether a TCP connection from ``source`` (in namespace ``ns``) gets through."""
    import sys
    code = ("import socket, sys\ns = socket.socket()\ns.settimeout(3)\n"
            f"{'s.bind((%r, 0))' % source if source else ''}\n"
            f"try:\n    s.connect(({address!r}, {port}))\nexcept OSError:\n    sys.exit(1)\n")
    cmd = ([] if ns is None else ["ip", "netns", "exec", ns]) + [sys.executable, "-c", code]
    return subprocess.run(cmd, capture_output=True, timeout=20).returncode == 0


@pytest.mark.root
@pytest.mark.skipif(shutil.which("nft") is None, reason="nft missing")
def test_a_remote_p4runtime_port_is_open_to_the_harness_and_loopback_only(tmp_path,
                                                                        two_clients):
    """The guard of a remote switch's P4Runtime port, made on its server (here this
    machine, reached without ssh) for the harness's address 10.213.9.2: a listener on
    the server's address takes connections from .2 and from the server itself, refuses
    .3; the table is listed under the server in the record and removed there."""
    import socket
    from qaina_bench.harness.running.record import RunRecord
    from qaina_bench.harness.running.remoteguard import RemoteP4RuntimeGuard
    ns, here = two_clients
    listener = socket.create_server((here, 0))
    port = listener.getsockname()[1]
    guard = RemoteP4RuntimeGuard(port, "10.213.9.2", Server("localhost"))
    rec = RunRecord("cluster-p4rt", tmp_path)
    rec.add_remote_nft_table("localhost", "root", guard.family, guard.table)
    try:
        assert connects(ns, "10.213.9.3", here, port)  # open before the guard
        guard.close_port()
        assert guard.exists() and guard.table.startswith("qaina_p4rt_")
        assert connects(ns, "10.213.9.2", here, port)
        assert not connects(ns, "10.213.9.3", here, port)
        assert connects(None, None, here, port)  # the server itself, over lo
        assert f"localhost: nftables table inet {guard.table}" in rec.leftovers(wait=0)
        assert f"localhost: deleted nftables table inet {guard.table}" in \
            rec.remove_resources()
        assert not guard.exists() and rec.leftovers(wait=0) == []
        assert connects(ns, "10.213.9.3", here, port)
    finally:
        guard.remove()
        listener.close()


@pytest.mark.root
@pytest.mark.skipif(shutil.which("simple_switch_grpc") is None or shutil.which("nft") is None,
                    reason="BMv2 or nft missing")
def test_a_remote_bmv2_started_through_remote_launch_is_programmed_read_and_stopped(tmp_path):
    """``RemoteBMv2Target`` as ``ClusterSwitch`` runs it on a server, the server being
    this machine (reached without ssh): its guard made there, the switch started by
    ``remote launch``, programmed over P4Runtime, its registers read through its
    Thrift CLI there; stopping it removes the guard and its notifications socket."""
    import os
    import signal
    import sys
    from qaina_bench.harness.running.remote import free_port
    from qaina_bench.harness.running.remotebmv2 import RemoteBMv2Target
    from qaina_bench.harness.switches.control import SwitchConnection
    target = RemoteBMv2Target("rsw", {}, free_port(), 41, tmp_path / "rsw.log",
                              thrift_port=free_port(), server=Server("localhost"))
    target.guard.close_port()
    cmd = [sys.executable, "-m", "qaina_bench.harness.running.remote", "launch",
           "--log", str(target.log_path), "--"] + target.command()
    target.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                   start_new_session=True)
    pid = json.loads(target.proc.stdout.readline())["pid"]
    conn = SwitchConnection("rsw", target.grpc_addr, 41)
    try:
        assert target.guard.exists()
        target.wait_ready(conn, 20)
        conn.arbitrate()
        conn.set_pipeline(target.device_config())
        cells = target.register_read("MyIngress.agg_count")
        assert cells and set(cells) == {0}
    finally:
        conn.close()
        if target.proc.poll() is None:
            os.kill(pid, signal.SIGTERM)
        target.stop()
    assert target.proc.poll() is not None
    assert not target.guard.exists()
    assert not os.path.exists(target.notifications[len("ipc://"):])


def test_bmv2_here_is_asked_for_only_when_a_switch_is_placed_here(tmp_path, monkeypatch):
    """Every switch on other servers: this machine needs no BMv2, p4c or nft (their
    servers are checked); a leaf left here: the one-line error of a plain run."""
    from qaina_bench.harness.running.clustercheck import local_bmv2_check
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # no BMv2, p4c (/usr/local) or nft (/usr/sbin)
    topo = build_topology(RunConfig.flat(topo="leafspine", jobs=1, workers=4))
    spec = tmp_path / "c.yaml"
    spec.write_text("servers: [localhost, n2, n3]\npin: {lf1: n2, lf2: n3}\n")
    local_bmv2_check(Cluster.parse(str(spec)), topo)
    with pytest.raises(ConfigError, match=r"^--target bmv2: simple_switch_grpc and p4c not "
                       r"on PATH.*\(switch lf1 runs here\)$"):
        local_bmv2_check(Cluster.parse("localhost,n2,n3"), topo)
    with pytest.raises(ConfigError, match=r"^--target bmv2: simple_switch_grpc"):
        local_bmv2_check(None, topo)


@pytest.mark.skipif(shutil.which("p4c") is None, reason="p4c missing")
def test_p4c_on_another_machine_compiles_through_its_stdin_and_stdout(tmp_path, monkeypatch):
    """``compile_p4(on=...)`` as over ssh (the other machine being this one, its
    temporary directory under a TMPDIR of the test's): the files come back into the
    cache here, their P4Info the committed one, and nothing is left there."""
    import os
    from qaina_bench.harness.switches.targets import compile_p4
    from qaina_bench.p4 import program
    from qaina_bench.p4.p4info import P4Info, difference
    there = tmp_path / "there"
    there.mkdir()
    monkeypatch.setenv("TMPDIR", str(there))
    json_path, info_path = compile_p4(32, cache=tmp_path / "cache", on=lambda *cmd: list(cmd))
    assert json_path.parent.parent == tmp_path / "cache"
    assert json.loads(json_path.read_text())["pipelines"]
    assert difference(program.p4info(32).proto, P4Info.load(info_path).proto) is None
    assert os.listdir(there) == []
    bad = lambda *cmd: ["sh", "-c", "exit 1"] if cmd[0] == "sh" else list(cmd)  # noqa: E731
    from qaina_bench.harness.switches.targets import TargetError
    with pytest.raises(TargetError, match="^p4c there failed on the 64-word qaina.p4"):
        compile_p4(64, cache=tmp_path / "cache", on=bad)


def launch_capture(tmp_path, interface: str):
    """A tcpdump capture of ``interface`` started as a remote node's is (``remote launch``
    of ``remotecapture.command``), on this machine; (its process, its entry)."""
    import sys
    from qaina_bench.harness.running.capture import CapturePlan
    from qaina_bench.harness.running.remotecapture import command
    plan = CapturePlan({interface: "n"}, "tcpdump", shutil.which("tcpdump"), 10)
    path, log = tmp_path / "run" / "pcap" / f"{interface}.pcap", tmp_path / f"{interface}.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    cmd = command(plan.command(interface, path))
    proc = subprocess.Popen([sys.executable, "-m", "qaina_bench.harness.running.remote",
                             "launch", "--log", str(log), "--"] + cmd,
                            stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
    pid = json.loads(proc.stdout.readline())["pid"]
    return proc, {"pid": pid, "file": str(path), "log": str(log)}


@pytest.mark.root
@pytest.mark.skipif(shutil.which("tcpdump") is None, reason="tcpdump missing")
def test_a_servers_captures_are_waited_for_stopped_and_counted_there(tmp_path):
    import socket
    from qaina_bench.harness.running.cluster import run_remote
    proc, entry = launch_capture(tmp_path, "lo")
    try:
        res = run_remote(Server("localhost"), ["captures", "wait", "tcpdump", "20"],
                         json.dumps([entry]))
        assert res.returncode == 0, res.stderr
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            for _ in range(5):
                s.sendto(b"qaina", ("127.0.0.1", 9))
        res = run_remote(Server("localhost"), ["captures", "stop", "tcpdump", "10"],
                         json.dumps([entry]))
        assert res.returncode == 0, res.stderr
        got = json.loads(res.stdout)[str(entry["pid"])]
        size = (tmp_path / "run" / "pcap" / "lo.pcap").stat().st_size
        assert got["bytes"] == size > 24 and got["captured"] >= 5, got
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    bad, entry = launch_capture(tmp_path, "qbnosuch0")  # fails: one line, naming it
    res = run_remote(Server("localhost"), ["captures", "wait", "tcpdump", "20"],
                     json.dumps([entry]))
    bad.wait(10)
    assert res.returncode == 1 and res.stderr.startswith("tcpdump on qbnosuch0 exited")
    assert len(res.stderr.strip().splitlines()) == 1


@pytest.mark.root
@pytest.mark.skipif(shutil.which("mnexec") is None, reason="mnexec missing")
def test_host_cpu_on_a_cluster_limits_each_host_through_its_servers_shell(tmp_path, record_dir):
    from qaina_bench.harness.running.cpulimit import cgroup_dirs, limit_problem
    if limit_problem():
        pytest.skip(limit_problem())
    summary, _ = execute(tmp_path, topo="leafspine", jobs=1, workers=2, bits=[4],
                         iterations=4, cluster="localhost", host_cpu=0.1)
    assert summary["complete"], summary["errors"]
    cost = summary["cpu_cost"]
    agents = [p for p in cost["processes"].values() if p["component"] == "agents"]
    assert len(agents) == 2
    for p in agents:  # each agent ran in its host's cgroup: 0.1 cores at most
        assert p["user_s"] + p["system_s"] <= 0.1 * cost["window_s"] + 0.05, p
    assert not any(d.exists() for h in ("h1", "h2") for d in cgroup_dirs(h))
    assert not list(record_dir.glob("*.json"))
