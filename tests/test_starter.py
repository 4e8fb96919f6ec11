"""The agent starter (``harness/running/starter.py``): each fork runs in the namespace
it is given, its status, CPU times and output come back, signals reach it, and
nothing it started outlives the harness."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from qaina_bench.harness.running.cpustat import CpuLedger
from qaina_bench.harness.running.processes import agent_env
from qaina_bench.harness.running.starter import AgentStarter, StarterError

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="setns needs root")
HERE = Path(__file__).parent


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def wait_for(check, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@pytest.fixture
def starter(tmp_path):
    env = {**agent_env(), "PYTHONPATH": str(HERE)}
    s = AgentStarter("starter_probe", env, tmp_path / "starter.log")
    yield s
    s.close()


@pytest.fixture
def namespace():
    """A process in a network namespace of its own, as a Mininet host's shell is."""
    holder = subprocess.Popen(["unshare", "--net", "sleep", "120"])
    wait_for(lambda: os.stat(f"/proc/{holder.pid}/ns/net").st_ino
             != os.stat("/proc/self/ns/net").st_ino)
    yield holder
    holder.kill()
    holder.wait()


def seen(path: Path) -> dict:
    wait_for(path.exists)
    return json.loads(path.read_text())


def test_a_fork_runs_main_in_its_hosts_namespace_and_its_status_and_times_come_back(
        tmp_path, starter, namespace):
    starter.wait_loaded(60)
    assert starter.loaded
    ledger = CpuLedger()
    fork = starter.start([str(tmp_path / "seen.json"), "burn"], namespace.pid,
                         tmp_path / "probe.log")
    ledger.watch("probe", "agents", fork.pid)
    ledger.begin()
    wait_for(lambda: ledger.poll(fork) is not None)
    ledger.end()
    assert fork.returncode == 3 and fork.wait(1) == 3
    got = seen(tmp_path / "seen.json")
    assert got["net"] == os.stat(f"/proc/{namespace.pid}/ns/net").st_ino
    assert got["cwd"] == os.getcwd()
    assert got["ppid"] == starter.pid and got["sid"] == got["pid"]  # a session of its own
    assert got["threads"] == "1"  # agent_env
    assert f"probe {fork.pid} here" in (tmp_path / "probe.log").read_text()
    user, system = fork.final_times
    assert 0.25 <= user + system < 5
    probe = ledger.readings()["processes"]["probe"]
    assert probe["user_s"] + probe["system_s"] >= 0.2  # from its final times


def test_signals_reach_the_fork_and_the_signal_comes_back_as_its_status(
        tmp_path, starter, namespace):
    forks = [starter.start([str(tmp_path / f"seen{i}.json"), "sleep"], namespace.pid,
                           tmp_path / f"probe{i}.log") for i in range(2)]
    for i, fork in enumerate(forks):
        seen(tmp_path / f"seen{i}.json")
        assert fork.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        forks[0].wait(0.3)
    forks[0].terminate()
    forks[1].kill()
    assert forks[0].wait(10) == -signal.SIGTERM
    assert forks[1].wait(10) == -signal.SIGKILL
    forks[0].kill()  # ended: nothing is signalled, nothing is raised


def test_what_a_fork_raises_is_its_own_last_line_not_the_starters(tmp_path, starter,
                                                                   namespace):
    """The agent's own error ends its log as its process's would (the run quotes that
    line); only what fails before the agent runs is the starter's."""
    fork = starter.start([str(tmp_path / "seen.json"), "raise"], namespace.pid,
                         tmp_path / "probe.log")
    assert fork.wait(10) == 1
    last = (tmp_path / "probe.log").read_text().strip().splitlines()[-1]
    assert last == "OSError: [Errno 101] Network is unreachable"


def test_a_fork_that_cannot_enter_its_namespace_says_why_in_its_log(tmp_path, starter):
    gone = subprocess.Popen(["true"])
    gone.wait()
    fork = starter.start([str(tmp_path / "seen.json"), "burn"], gone.pid,
                         tmp_path / "probe.log")
    assert fork.wait(10) == 1
    assert "agent starter: FileNotFoundError" in (tmp_path / "probe.log").read_text()
    assert not (tmp_path / "seen.json").exists()


def test_a_starter_that_cannot_load_its_module_is_one_clear_error(tmp_path):
    s = AgentStarter("no_such_module_here", agent_env(), tmp_path / "starter.log")
    try:
        with pytest.raises(StarterError, match=r"agent starter exited \(1\); see .*starter.log"):
            s.wait_loaded(60)
        with pytest.raises(StarterError, match="agent starter exited"):
            s.start(["x"], os.getpid(), tmp_path / "x.log")
    finally:
        s.close()
    assert "No module named 'no_such_module_here'" in (tmp_path / "starter.log").read_text()


def test_what_the_starter_started_ends_when_the_harness_is_killed(tmp_path, namespace):
    """The harness killed with -9: the starter sees its pipe close and stops its forks."""
    harness = textwrap.dedent(f"""
        import json, sys, time
        from pathlib import Path
        from qaina_bench.harness.running.processes import agent_env
        from qaina_bench.harness.running.starter import AgentStarter
        tmp = Path({str(tmp_path)!r})
        s = AgentStarter("starter_probe", {{**agent_env(), "PYTHONPATH": {str(HERE)!r}}},
                         tmp / "starter.log")
        fork = s.start([str(tmp / "seen.json"), "sleep"], {namespace.pid}, tmp / "p.log")
        print(json.dumps([s.pid, fork.pid]), flush=True)
        time.sleep(120)
    """)
    proc = subprocess.Popen([sys.executable, "-c", harness], stdout=subprocess.PIPE)
    starter_pid, fork_pid = json.loads(proc.stdout.readline())
    seen(tmp_path / "seen.json")
    assert alive(starter_pid) and alive(fork_pid)
    proc.kill()
    proc.wait()
    wait_for(lambda: not alive(fork_pid) and not alive(starter_pid), timeout=15)


def remote_launch(tmp_path, name: str, ns_pid: int, *args: str,
                  cgroups: list[str] = ()) -> subprocess.Popen:
    """``remote launch --starter`` as a server of a cluster runs it."""
    return subprocess.Popen(
        [sys.executable, "-m", "qaina_bench.harness.running.remote", "launch", "--log",
         str(tmp_path / "probe.log"), "--starter", name, "--ns-pid", str(ns_pid),
         *(["--cgroups", ",".join(cgroups)] if cgroups else []), "--", *args],
        stdout=subprocess.PIPE, text=True)


@pytest.fixture
def host_cgroups():
    """The cgroups of a CPU-limited host (``--host-cpu``), made for the test."""
    from qaina_bench.harness.running.cpulimit import limit_problem, process_cgroups
    if limit_problem():
        pytest.skip(limit_problem())
    name = f"qbstarter{os.getpid()}"
    dirs = process_cgroups(name)
    for d in dirs:
        os.makedirs(d, exist_ok=True)
    yield name, dirs
    for d in dirs:
        wait_for(lambda: not Path(d, "tasks").read_text().strip())
        os.rmdir(d)


def in_cgroups(got: dict, name: str) -> set[str]:
    """The hierarchies (of cpu and cpuacct) where the probe was in cgroup ``name``."""
    return {c for line in got["cgroups"] for c in line.split(":")[1].split(",")
            if line.endswith(f":/{name}") and c in ("cpu", "cpuacct")}


def test_a_fork_on_a_limited_host_runs_in_its_cgroups(tmp_path, starter, namespace,
                                                      host_cgroups):
    name, dirs = host_cgroups
    fork = starter.start([str(tmp_path / "seen.json"), "burn"], namespace.pid,
                         tmp_path / "probe.log", dirs)
    assert fork.wait(30) == 3
    assert in_cgroups(seen(tmp_path / "seen.json"), name) == {"cpu", "cpuacct"}
    other = starter.start([str(tmp_path / "other.json"), "burn"], namespace.pid,
                          tmp_path / "probe.log")
    assert other.wait(30) == 3 and not in_cgroups(seen(tmp_path / "other.json"), name)


def test_a_fork_whose_cgroup_is_missing_says_why_in_its_log(tmp_path, starter, namespace):
    missing = f"/sys/fs/cgroup/cpu/qbstarter-none-{os.getpid()}"
    fork = starter.start([str(tmp_path / "seen.json"), "burn"], namespace.pid,
                         tmp_path / "probe.log", [missing])
    assert fork.wait(10) == 1
    assert "agent starter: FileNotFoundError" in (tmp_path / "probe.log").read_text()
    assert missing in (tmp_path / "probe.log").read_text()
    assert not (tmp_path / "seen.json").exists()


@pytest.fixture
def listening(tmp_path):
    """A starter listening on an abstract socket, as on a server of a cluster."""
    name = f"qaina-test-starter-{os.getpid()}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "qaina_bench.harness.running.forkserver", "--listen", name,
         "starter_probe"], env={**agent_env(), "PYTHONPATH": str(HERE)},
        stdout=subprocess.PIPE, start_new_session=True)
    assert json.loads(proc.stdout.readline()) == {"loaded": True}
    yield name, proc
    proc.kill()
    proc.wait()


def test_remote_launch_through_a_listening_starter_gives_the_forks_pid_and_status(
        tmp_path, listening, namespace):
    name, starter = listening
    launch = remote_launch(tmp_path, name, namespace.pid, str(tmp_path / "seen.json"), "burn")
    info = json.loads(launch.stdout.readline())
    got = seen(tmp_path / "seen.json")
    assert info["pid"] == got["pid"] and got["ppid"] == starter.pid
    assert got["net"] == os.stat(f"/proc/{namespace.pid}/ns/net").st_ino
    assert launch.wait(30) == 3  # the fork's status is the launch's
    assert f"probe {info['pid']} here" in (tmp_path / "probe.log").read_text()


def test_remote_launch_puts_the_fork_in_the_cgroups_it_is_given(tmp_path, listening,
                                                               namespace, host_cgroups):
    name, dirs = host_cgroups
    launch = remote_launch(tmp_path, listening[0], namespace.pid, str(tmp_path / "seen.json"),
                           "burn", cgroups=dirs)
    assert launch.wait(30) == 3
    assert in_cgroups(seen(tmp_path / "seen.json"), name) == {"cpu", "cpuacct"}


def test_sigterm_to_a_listening_starter_stops_its_forks_and_their_launches_end(
        tmp_path, listening, namespace):
    name, starter = listening
    launch = remote_launch(tmp_path, name, namespace.pid, str(tmp_path / "seen.json"), "sleep")
    pid = json.loads(launch.stdout.readline())["pid"]
    seen(tmp_path / "seen.json")
    starter.terminate()
    assert launch.wait(30) == 128 + signal.SIGTERM
    assert starter.wait(30) == 0
    wait_for(lambda: not alive(pid))


def ask(name: str, *requests) -> list[dict]:
    """What a listening starter answers ``requests`` (objects or raw lines), in order."""
    import socket
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(30)
        conn.connect("\0" + name)
        lines = [r if isinstance(r, bytes) else json.dumps(r).encode() for r in requests]
        conn.sendall(b"\n".join(lines) + b"\n")
        news = conn.makefile("rb")
        return [json.loads(news.readline()) for _ in requests]


def test_a_listening_starter_answers_a_bad_request_with_an_error_and_goes_on(
        tmp_path, listening, namespace):
    name, starter = listening
    good = {"argv": [str(tmp_path / "seen.json"), "burn"], "ns_pid": namespace.pid,
            "log": str(tmp_path / "probe.log")}
    answers = ask(name, {"n": 1, "argv": "x", "ns_pid": 1, "log": "l"},
                  {"n": 2, **good, "log": None}, {"n": 3, **good, "ns_pid": True},
                  {"n": 4, **good, "cgroups": [7]}, b"[1, 2]", {"n": 6, **good})
    assert [a.get("error") for a in answers[:5]] == [
        "not a request: argv must be a list", "not a request: log must be a str",
        "not a request: ns_pid must be a int", "not a request: argv and cgroups hold strings",
        "not a request: a request is a JSON object"]
    assert answers[5]["n"] == 6 and seen(tmp_path / "seen.json")["pid"] == answers[5]["pid"]
    assert starter.poll() is None
    assert [p.pid for p in psutil.Process(starter.pid).children()] in ([answers[5]["pid"]], [])


def test_a_listening_starter_closes_a_connection_from_another_user_unread(
        tmp_path, listening, namespace):
    name, starter = listening
    request = {"n": 1, "argv": [str(tmp_path / "seen.json"), "burn"], "ns_pid": namespace.pid,
               "log": str(tmp_path / "evil.log")}
    probe = ("import socket\ns = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
             f"s.connect({chr(0) + name!r})\ns.settimeout(30)\ntry:\n"
             f"    s.sendall({json.dumps(request).encode() + b'{chr(10)}'!r})\n"
             "    print('closed' if not s.recv(100) else 'answered')\n"
             "except (BrokenPipeError, ConnectionResetError):\n    print('closed')")
    out = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                          "/usr/bin/python3", "-c", probe], capture_output=True, text=True,
                         timeout=60)
    assert out.stdout.strip() == "closed", out  # nothing said, nothing started
    assert not (tmp_path / "evil.log").exists() and not (tmp_path / "seen.json").exists()
    assert starter.poll() is None and not psutil.Process(starter.pid).children()
    assert ask(name, {**request, "n": 2, "log": str(tmp_path / "probe.log")})[0]["n"] == 2


def test_remote_launch_without_a_starter_there_is_one_line(tmp_path):
    launch = remote_launch(tmp_path, f"qaina-test-nobody-{os.getpid()}", os.getpid(), "x")
    out, _ = launch.communicate(timeout=30)
    assert launch.returncode == 1
    assert out.startswith(f"agent starter qaina-test-nobody-{os.getpid()} on ")
    assert "Connection refused" in out and len(out.strip().splitlines()) == 1


def test_remote_launch_takes_its_options_in_any_order_and_refuses_wrong_ones():
    from qaina_bench.harness.running.remote import launch_options
    got = launch_options(["--cgroups", "/a,/b", "--ns-pid", "7", "--starter", "s",
                          "--log", "l", "--", "cmd", "--", "x"])
    assert got == {"log": "l", "starter": "s", "ns_pid": 7, "cgroups": ["/a", "/b"],
                   "cmd": ["cmd", "--", "x"]}
    assert launch_options(["--log", "l", "--", "cmd"])["starter"] is None
    for wrong in (["--log", "l", "cmd"],                          # no --
                  ["--log", "l", "--"],                           # no command
                  ["--starter", "s", "--ns-pid", "7", "--", "c"],  # no --log
                  ["--log", "l", "--starter", "s", "--", "c"],     # no --ns-pid
                  ["--log", "l", "--starter", "s", "--ns-pid", "x", "--", "c"],
                  ["--log", "l", "--cgroups", "/a", "--", "c"],    # cgroups, no starter
                  ["--log", "l", "--log", "m", "--", "c"],         # twice
                  ["--log", "l", "--verbose", "--", "c"],
                  ["--log", "--", "c"]):
        assert launch_options(wrong) is None, wrong
    bad = subprocess.run([sys.executable, "-m", "qaina_bench.harness.running.remote",
                          "launch", "--log", "l", "--cgroups", "/a", "--", "true"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stderr.startswith("usage: launch --log PATH")
    assert not Path("l").exists()
    for args, code, said in ((["--log", "", "--", "true"], 2, "usage: launch"),
                             (["--log", "/proc/qb/x.log", "--", "true"], 2,
                              "launch: log /proc/qb/x.log: No such file or directory"),
                             (["--log", "/tmp/qb-launch.log", "--", "/nonexistent/x"], 127,
                              "launch: /nonexistent/x: no such command here")):
        res = subprocess.run([sys.executable, "-m", "qaina_bench.harness.running.remote",
                              "launch", *args], capture_output=True, text=True, timeout=60)
        assert res.returncode == code and not res.stdout, (args, res.stdout)  # no PID line
        assert res.stderr.startswith(said) and len(res.stderr.strip().splitlines()) == 1
