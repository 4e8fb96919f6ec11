"""Faults around real runs, as root: Ctrl-C at any moment, SIGTERM twice, kill -9 of the
CLI, a switch that dies at start. Afterwards nothing the run started is left, and the
next run works."""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from qaina_bench.harness.config import RunConfig
from qaina_bench.harness.running.record import RunRecord, record_dir, stale_records
from qaina_bench.harness.running.run import Run

pytestmark = [
    pytest.mark.root,  # Mininet
    pytest.mark.skipif(shutil.which("mnexec") is None,
                       reason="mnexec missing: apt-get install mininet"),
]

STAR = ["--topo", "star", "--jobs", "1", "--workers", "4"]


def cli(tmp_path, run_id, *args) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "qaina_bench.harness.cli", "up", *STAR, *args,
           "--results-dir", str(tmp_path), "--run-id", run_id]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def wait_for(condition, timeout=60.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def iterating(tmp_path, run_id, workers: int = 4) -> bool:
    """Whether every agent has recorded an iteration."""
    logs = list((tmp_path / run_id / "agents").glob("*.jsonl"))
    return len(logs) == workers and all('"iteration"' in p.read_text() for p in logs)


def record_of(run_id) -> dict | None:
    try:
        return json.loads((record_dir() / f"{run_id}.json").read_text())
    except (OSError, ValueError):
        return None


def leftovers(record_data: dict) -> list[str]:
    """What a run's record lists that still exists (a fresh record object does the
    check, with PIDs told apart by their start time)."""
    rec = RunRecord(record_data["run_id"], directory=record_dir())
    rec.data = record_data
    return rec.leftovers()


def iterations_logged(path: Path) -> int:
    return sum('"iteration"' in line for line in path.read_text().splitlines(keepends=True)
               if line.endswith("\n"))


def freeze_after_an_iteration(tmp_path, run_id, agents: dict) -> dict:
    """SIGSTOP each agent (name -> PID) as soon as its log holds an iteration: frozen,
    the jobs cannot end, however slow or busy the machine is. Returns name -> the
    iterations its log holds (final while it is stopped)."""
    frozen = {}

    def step():
        for name, pid in agents.items():
            log = tmp_path / run_id / "agents" / f"{name}.jsonl"
            if name not in frozen and log.exists() and iterations_logged(log):
                try:
                    os.kill(pid, signal.SIGSTOP)
                except ProcessLookupError:  # it ended already
                    pass
                frozen[name] = pid
        return len(frozen) == len(agents)

    wait_for(step, what="an iteration of every agent")
    return {name: iterations_logged(tmp_path / run_id / "agents" / f"{name}.jsonl")
            for name in agents}


def read_until(proc: subprocess.Popen, text: bytes, timeout: float = 60.0) -> bytes:
    """What the process prints until ``text`` (or its end)."""
    out, deadline = b"", time.monotonic() + timeout
    while text not in out and time.monotonic() < deadline:
        if select.select([proc.stdout], [], [], 0.1)[0]:
            chunk = os.read(proc.stdout.fileno(), 4096)
            if not chunk:
                break
            out += chunk
    return out


def test_ctrl_c_tears_everything_down_and_keeps_the_results(tmp_path):
    """The agents are frozen mid-run before the Ctrl-C and thawed once the CLI says it
    is tearing down: the Ctrl-C comes while the jobs run, whatever the machine's load."""
    proc = cli(tmp_path, "interrupted", "--iterations", "12", "--bits", "32", "--bw", "0.5")
    wait_for(lambda: (r := record_of("interrupted")) and
             sum(p["what"].startswith("agent") for p in r["processes"]) == 4,
             what="four agents in the run record")
    record = record_of("interrupted")
    agents = {p["what"].split()[1]: p["pid"] for p in record["processes"]
              if p["what"].startswith("agent")}
    try:
        done = freeze_after_an_iteration(tmp_path, "interrupted", agents)
        proc.send_signal(signal.SIGINT)
        out = read_until(proc, b"interrupted: tearing down")
    finally:
        for pid in agents.values():
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
    rest, _ = proc.communicate(timeout=60)
    out += rest
    assert proc.returncode == 130, out.decode()
    assert b"interrupted: tearing down" in out and b"Traceback" not in out, out.decode()
    summary = json.loads((tmp_path / "interrupted" / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["complete"] is False
    assert 1 <= min(done.values()) and max(done.values()) < 12, done
    assert summary["jobs"][0]["iterations_done"] >= min(done.values())
    assert record_of("interrupted") is None
    assert leftovers(record) == []


def test_ctrl_c_while_a_finished_run_is_torn_down_is_not_lost(tmp_path, monkeypatch, capsys):
    """A Ctrl-C after the jobs ended, while the run is torn down: the teardown runs to
    its end, the results are whole, and `up` still exits 130 saying so."""
    from qaina_bench.harness import cli as cli_module

    teardown = Run._teardown

    def teardown_with_a_ctrl_c(self):
        os.kill(os.getpid(), signal.SIGINT)  # the user's Ctrl-C, delivered right now
        teardown(self)

    monkeypatch.setattr(Run, "_teardown", teardown_with_a_ctrl_c)
    cfg = RunConfig.flat(results_dir=str(tmp_path), topo="star", jobs=1, workers=2,
                    iterations=2, run_id="late-ctrl-c")
    with pytest.raises(SystemExit) as ended:
        cli_module.execute(cfg)
    assert ended.value.code == 130
    assert "interrupted while the run was torn down: its jobs had ended (complete)" \
        in capsys.readouterr().out
    summary = json.loads((tmp_path / "late-ctrl-c" / "summary.json").read_text())
    assert summary["status"] == "complete" and summary["complete"] is True
    assert record_of("late-ctrl-c") is None


def test_ctrl_c_during_bring_up_leaves_nothing(tmp_path):
    proc = cli(tmp_path, "early", "--iterations", "2")
    record = wait_for(lambda: (r := record_of("early")) and r["processes"] and r,
                      what="the first process in the run record")
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, out.decode()
    assert b"Traceback" not in out and b"Aborted" not in out, out.decode()
    summary = json.loads((tmp_path / "early" / "summary.json").read_text())
    assert summary["status"] == "interrupted"
    assert record_of("early") is None
    assert leftovers(record_of_last(record)) == []
    assert not list(record_dir().glob(".*"))  # no half-written record either


def record_of_last(first: dict) -> dict:
    """The record as it was at its fullest: every link end the topology has."""
    full = dict(first)
    full["interfaces"] = sorted({*first["interfaces"], *(f"s1-eth{i}" for i in range(1, 5))})
    return full


def test_sigterm_twice_still_tears_down_and_writes_the_summary(tmp_path):
    proc = cli(tmp_path, "terminated", "--iterations", "12", "--bits", "32", "--bw", "0.5")
    wait_for(lambda: iterating(tmp_path, "terminated"), what="the first iteration")
    record = record_of("terminated")
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    proc.send_signal(signal.SIGTERM)  # while tearing down
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, out.decode()
    assert b"Aborted" not in out, out.decode()
    summary = json.loads((tmp_path / "terminated" / "summary.json").read_text())
    assert summary["status"] == "interrupted"
    assert record_of("terminated") is None
    assert leftovers(record) == []


def hangup_default():
    """SIGHUP's default action in a child, whatever its parent has (under ``nohup``,
    CI's runner included, it inherits SIGHUP ignored)."""
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def test_a_hangup_of_the_terminal_tears_down_like_sigterm(tmp_path):
    """The terminal of a run closes (an ssh session drops): SIGHUP, and writes to the
    terminal fail from then on. The run is torn down, its summary written; under
    ``nohup`` (SIGHUP ignored) it runs on to its end."""
    import pty
    master, slave = pty.openpty()
    cmd = [sys.executable, "-m", "qaina_bench.harness.cli", "up", *STAR, "--iterations", "12",
           "--bits", "32", "--bw", "0.5", "--results-dir", str(tmp_path), "--run-id", "hup"]
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave,
                            preexec_fn=hangup_default)
    os.close(slave)
    try:
        wait_for(lambda: iterating(tmp_path, "hup"), what="the first iteration")
        record = record_of("hup")
    finally:
        os.close(master)  # the terminal is gone: writes to it fail (EIO)
    time.sleep(1.0)  # the progress line meets the closed terminal before SIGHUP comes
    proc.send_signal(signal.SIGHUP)
    assert proc.wait(60) == 130
    summary = json.loads((tmp_path / "hup" / "summary.json").read_text())
    assert summary["status"] == "interrupted"
    assert record_of("hup") is None
    assert leftovers(record) == []
    ignored = subprocess.Popen(["nohup", *cmd[:-1], "hup-ignored", "--iterations", "2"],
                               stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT)
    wait_for(lambda: iterating(tmp_path, "hup-ignored"), what="the first iteration")
    ignored.send_signal(signal.SIGHUP)
    out, _ = ignored.communicate(timeout=120)
    assert ignored.returncode == 0, out.decode()
    summary = json.loads((tmp_path / "hup-ignored" / "summary.json").read_text())
    assert summary["status"] == "complete"


def test_after_kill_9_of_the_cli_the_next_run_removes_what_it_left(tmp_path):
    proc = cli(tmp_path, "killed", "--iterations", "12", "--bits", "32", "--bw", "0.5")
    wait_for(lambda: iterating(tmp_path, "killed"), what="the first iteration")
    record = record_of("killed")
    proc.kill()
    proc.wait(10)
    assert leftovers(record)  # the switch, the agents and the links are still there
    sums = [d for d in record.get("temp_directories", []) if "qaina-bench-sums-" in d]
    assert len(sums) == 1 and Path(sums[0]).is_dir()  # the exact sums the agents map
    assert [r.run_id for r in stale_records()] == ["killed"]
    again = cli(tmp_path, "after-kill", "--iterations", "1")
    out, _ = again.communicate(timeout=120)
    assert again.returncode == 0, out.decode()
    assert b"run killed ended without tearing down" in out
    assert leftovers(record) == []
    assert not Path(sums[0]).exists()
    assert record_of("killed") is None


def test_kill_9_while_the_network_is_built_leaves_nothing_clean_cannot_remove(tmp_path):
    """The links' ends are in the run's record before the network is built: after a
    kill -9 amid the build, `clean` removes the switch-to-switch pairs it left in
    this namespace, and the next leaf-spine run starts."""
    cmd = [sys.executable, "-m", "qaina_bench.harness.cli", "up", "--topo", "leafspine",
           "--jobs", "1", "--workers", "2", "--iterations", "1", "--results-dir",
           str(tmp_path), "--run-id", "cut"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    first = Path("/sys/class/net/lf1-eth1")
    deadline = time.monotonic() + 120
    while not first.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    proc.kill()
    proc.wait(10)
    assert first.exists(), "the run ended before its first link: nothing was cut short"
    record = record_of("cut")
    # the kill came amid the build: the nodes' shells, recorded once it is done, are not
    assert not [p for p in record["processes"] if p["what"].startswith("mininet shell")]
    assert "lf1-eth1" in record["interfaces"]
    out = subprocess.run([sys.executable, "-m", "qaina_bench.harness.cli", "clean"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    left = [p.name for p in Path("/sys/class/net").iterdir()
            if p.name.split("-eth")[0] in ("lf1", "lf2", "sp1", "sp2")]
    assert left == [] and record_of("cut") is None, out.stdout
    again = subprocess.run(cmd[:-1] + ["after-cut"], capture_output=True, text=True,
                           timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr


def parent_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def test_the_agents_are_forks_of_the_recorded_starter_and_end_with_a_killed_cli(tmp_path):
    """The run record lists the starter and every agent; each agent is its fork (in its
    host's network namespace); kill -9 of the CLI closes the starter's pipe, and the
    starter stops the agents and exits, while the switch waits for ``clean``."""
    proc = cli(tmp_path, "forked", "--iterations", "12", "--bits", "32", "--bw", "0.5")
    try:
        wait_for(lambda: iterating(tmp_path, "forked"), what="the first iteration")
        record = record_of("forked")
        starter = [p["pid"] for p in record["processes"] if p["what"] == "starter of the agents"]
        agents = [p["pid"] for p in record["processes"] if p["what"].startswith("agent ")]
        assert len(starter) == 1 and len(agents) == 4
        assert {parent_of(pid) for pid in agents} == {starter[0]}
        root_net = os.stat("/proc/self/ns/net").st_ino
        assert all(os.stat(f"/proc/{pid}/ns/net").st_ino != root_net for pid in agents)
    finally:
        proc.kill()
        proc.wait(10)
    wait_for(lambda: all(parent_of(pid) is None for pid in agents + starter), timeout=30,
             what="the starter and the agents to end")
    left = leftovers(record)
    assert left and not any(line.startswith(("process agent", "process starter"))
                            for line in left), left
    assert subprocess.run([sys.executable, "-m", "qaina_bench.harness.cli", "clean"],
                          capture_output=True).returncode == 0
    assert leftovers(record) == []


def test_a_switch_that_dies_is_named_with_its_log_and_nothing_is_left(tmp_path, monkeypatch):
    from qaina_bench.harness.switches import targets
    from qaina_bench.harness.switches.targets import TargetError

    def broken(self):
        return [sys.executable, "-c", "import sys; print('bad switch build'); sys.exit(3)"]

    monkeypatch.setattr(targets.EmbeddedTarget, "command", broken)
    cfg = RunConfig.flat(results_dir=str(tmp_path), topo="star", jobs=1, workers=2, iterations=1,
                    run_id="dead-switch")
    run = Run(cfg, echo=lambda *a, **k: None)
    with pytest.raises(TargetError) as err:
        run.execute()
    message = str(err.value)
    assert "s1" in message and "exited with 3" in message
    assert "s1.log" in message and "bad switch build" in message
    summary = json.loads((tmp_path / "dead-switch" / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["errors"]
    assert record_of("dead-switch") is None
    assert not Path("/sys/class/net/s1-eth1").exists()


def test_a_link_tc_would_not_shape_fails_the_run_and_nothing_is_left(tmp_path, monkeypatch):
    """Mininet only logs a tc command the kernel refuses and leaves the link unshaped:
    a run on it would call its unshaped links network-bound. Below the smallest rate
    (whose htb class tc refuses), the run fails with what tc said."""
    from qaina_bench.harness import config
    from qaina_bench.harness.running.mininetlog import LinkError
    monkeypatch.setattr(config, "MIN_BW", 0)
    cfg = RunConfig.flat(results_dir=str(tmp_path), topo="star", jobs=1, workers=2,
                         iterations=1, bw=1e-7, run_id="unshaped")
    run = Run(cfg, echo=lambda *a, **k: None)
    with pytest.raises(LinkError, match="shaping the links failed: tc said .*rate.* is requ"):
        run.execute()
    summary = json.loads((tmp_path / "unshaped" / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["errors"]
    assert record_of("unshaped") is None
    assert not Path("/sys/class/net/s1-eth1").exists()


def test_clean_removes_exactly_what_a_crashed_run_recorded(tmp_path):
    ours = subprocess.Popen(["sleep", "300"])
    theirs = subprocess.Popen(["sleep", "300"])
    subprocess.run(["ip", "link", "add", "qcleantest0", "type", "veth", "peer", "name",
                    "qcleantest1"], check=True)
    rec = RunRecord("crashed-run", directory=tmp_path)
    rec.data["owner"] = 2 ** 22 + 12345  # no such process: the run is dead
    rec.add_process(ours.pid, "switch s1")
    rec.add_interface("qcleantest0")
    rec.save()
    try:
        stale = stale_records(tmp_path)
        assert [r.run_id for r in stale] == ["crashed-run"]
        done = stale[0].remove()
        assert any("qcleantest0" in d for d in done)
        assert ours.wait(5) is not None
        assert theirs.poll() is None  # not recorded: untouched
        assert not Path("/sys/class/net/qcleantest0").exists()
        assert not rec.path.exists()
    finally:
        theirs.kill()
        ours.kill()
        subprocess.run(["ip", "link", "del", "qcleantest0"], capture_output=True)


@pytest.mark.parametrize("text", [
    "[1]", '{"run_id": "a"}', '{"run_id": "a", "owner": "abc", "processes": [], '
    '"interfaces": []}', '{"run_id": "a", "owner": 1}', "{not json", "null",
    '{"run_id": "a", "owner": 1, "processes": [5], "interfaces": []}',
    '{"run_id": "a", "owner": 1, "processes": [], "interfaces": [], "nft_tables": [5]}',
    '{"run_id": "a", "owner": 1, "processes": [], "interfaces": [], '
    '"switches": {"s1": {"device_id": 1}}}',
    '{"run_id": "a", "owner": 1, "processes": [], "interfaces": [], '
    '"servers": {"n2": {"processes": 5}}}'])
def test_a_file_in_the_record_directory_that_is_no_record_is_passed_over(tmp_path, text):
    """``clean``, ``shell`` and ``up`` read every ``*.json`` there: one that is not a
    run record (another tool's, or damaged) is not one of ours, and nobody crashes."""
    (tmp_path / "junk.json").write_text(text)
    env = dict(os.environ, QAINA_RECORD_DIR=str(tmp_path))
    for args in (["clean"], ["shell", "s1"]):
        res = subprocess.run([sys.executable, "-m", "qaina_bench.harness.cli", *args],
                             capture_output=True, text=True, env=env, timeout=120)
        assert "Traceback" not in res.stdout + res.stderr, (args, res.stdout, res.stderr)
        if args == ["clean"]:  # named, not taken for "nothing to clean"
            assert f"{tmp_path / 'junk.json'}: no run record this can read" in res.stdout
    assert stale_records(tmp_path) == [] and (tmp_path / "junk.json").exists()


@pytest.mark.parametrize("text", ["{bad", "[1]", "null", '{"processes": 5}',
                                  '{"cgroups": 7}', '{"nft_tables": [5]}',
                                  '{"processes": [{"pid": "x", "what": "y"}]}'])
def test_a_servers_part_that_is_no_record_is_refused_there_in_one_line(text):
    for action in ("remove", "leftovers"):
        res = subprocess.run([sys.executable, "-m", "qaina_bench.harness.running.remote",
                              action], input=text, capture_output=True, text=True, timeout=60)
        assert res.returncode == 2 and not res.stdout, (action, text, res.stdout)
        assert len(res.stderr.strip().splitlines()) == 1, res.stderr
        assert res.stderr.startswith(f"{action}: stdin is not a run record's part"), res.stderr


def test_a_reused_pid_is_not_taken_for_a_recorded_process(tmp_path):
    """A record whose PID now belongs to a process started later leaves it alone."""
    other = subprocess.Popen(["sleep", "300"])
    try:
        rec = RunRecord("old-run", directory=tmp_path)
        rec.data["owner"] = 2 ** 22 + 12346
        rec.data["processes"].append({"pid": other.pid, "what": "agent",
                                      "started": time.time() - 3600})
        rec.save()
        assert stale_records(tmp_path)[0].remove() == []
        assert other.poll() is None
    finally:
        other.kill()


def test_a_benchmark_killed_outright_is_cleaned_up_from_its_record(tmp_path):
    """`bench switch` records its veth pairs and switch like a run: after kill -9,
    `qaina-bench clean` removes exactly those."""
    env = dict(os.environ, QAINA_RECORD_DIR=str(tmp_path / "records"))
    bench = subprocess.Popen([sys.executable, "-m", "qaina_bench.harness.cli", "bench",
                              "switch", "--bits", "4", "--rate", "1000", "--seconds", "120"],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             cwd=tmp_path)

    def recorded():
        for path in (tmp_path / "records").glob("*.json"):
            data = json.loads(path.read_text())
            if data["processes"] and len(data["interfaces"]) >= 2:
                return data
        return None

    try:
        data = wait_for(recorded, what="the benchmark's record with its switch")
        temp = [d for path in (tmp_path / "records").glob("bench-*.json")
                for d in json.loads(path.read_text()).get("temp_directories", [])]
    finally:
        bench.kill()
        bench.wait()
    assert all(Path(f"/sys/class/net/{i}").exists() for i in data["interfaces"])
    out = subprocess.run([sys.executable, "-m", "qaina_bench.harness.cli", "clean"], env=env,
                         capture_output=True, text=True, timeout=120)
    assert data["run_id"] in out.stdout, out.stdout + out.stderr
    assert not any(Path(f"/sys/class/net/{i}").exists() for i in data["interfaces"])
    assert not leftovers(data)
    assert temp and not any(Path(d).exists() for d in temp)
    assert not list((tmp_path / "records").glob("bench-*.json"))


@pytest.mark.parametrize("args", [["switch", "--bits", "4", "--rate", "1000", "--seconds", "600",
                                   "--csv", "kept.csv"],
                                  ["control", "--repeat", "1000"],
                                  ["testbed", "--table", "cost", "--mode", "ina", "--workers", "4",
                                   "--iterations", "6", "--csv", "kept.csv"]],
                         ids=["switch", "control", "testbed"])
def test_a_benchmark_stopped_by_sigterm_removes_what_it_started(tmp_path, args):
    """SIGTERM stops `bench switch`, `control` and `testbed` as Ctrl-C does: exit 130,
    their switch, veth pairs, temporary directory and records are gone, no `clean`,
    and a --csv file that was there is left as it was (written only once complete)."""
    env = dict(os.environ, QAINA_RECORD_DIR=str(tmp_path / "records"))
    (tmp_path / "kept.csv").write_text("earlier,table\n")
    bench = subprocess.Popen([sys.executable, "-m", "qaina_bench.harness.cli", "bench", *args],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             cwd=tmp_path)
    seen = {}

    def started():  # the switch is running (its PID recorded) with its veth pairs
        for path in (tmp_path / "records").glob("*.json"):
            try:
                seen[path.name] = json.loads(path.read_text())
            except ValueError:  # being written
                continue
        return any(d["processes"] and d["interfaces"] for d in seen.values())

    try:
        wait_for(started, what="the benchmark's switch")
        bench.send_signal(signal.SIGTERM)
        _, err = bench.communicate(timeout=120)
    finally:
        bench.kill()
        bench.wait()
    assert bench.returncode == 130, err.decode()
    assert "interrupted" in err.decode() and "Traceback" not in err.decode(), err.decode()
    assert not list((tmp_path / "records").glob("*.json"))
    for data in seen.values():
        assert not leftovers(data)
        assert not any(Path(f"/sys/class/net/{i}").exists() for i in data["interfaces"])
    temps = [d for data in seen.values() for d in data.get("temp_directories", [])]
    assert not any(Path(d).exists() for d in temps)
    assert (tmp_path / "kept.csv").read_text() == "earlier,table\n"
    assert [p.name for p in tmp_path.iterdir() if p.is_file()] == ["kept.csv"]


def test_a_testbed_benchmark_killed_outright_leaves_no_temporary_directory(tmp_path):
    """`bench testbed` keeps its runs in a temporary directory listed in a record of
    its own: after kill -9, `qaina-bench clean` removes it with the run's network."""
    env = dict(os.environ, QAINA_RECORD_DIR=str(tmp_path / "records"))
    bench = subprocess.Popen([sys.executable, "-m", "qaina_bench.harness.cli", "bench",
                              "testbed", "--table", "transport", "--iterations", "12"],
                             env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             cwd=tmp_path)

    def started():  # the benchmark's directory recorded, and a run under way in it
        records = [json.loads(p.read_text()) for p in (tmp_path / "records").glob("*.json")]
        dirs = [d for r in records for d in r.get("temp_directories", [])]
        running = [r for r in records if r["interfaces"]]
        return dirs if dirs and running and any(Path(dirs[0]).iterdir()) else None

    try:
        dirs = wait_for(started, what="the benchmark's directory and a run in it")
    finally:
        bench.kill()
        bench.wait()
    out = subprocess.run([sys.executable, "-m", "qaina_bench.harness.cli", "clean"], env=env,
                         capture_output=True, text=True, timeout=120)
    assert f"deleted temporary directory {dirs[0]}" in out.stdout, out.stdout + out.stderr
    assert not Path(dirs[0]).exists()
    assert not list((tmp_path / "records").glob("*.json"))


@pytest.mark.parametrize("value,args,error", [
    (np.nan, [], "summing the exact aggregates: trace set bad: worker 3's gradient at "
     "iteration 0 holds inf or nan: replay finite gradients"),
    (1e10, ["--quantizer", "maxfine"], "trace set bad: worker 3's gradient at iteration 0 "
     "reaches |g| = 1e+10, beyond the largest scale of --quantizer maxfine (2**31.75 = "
     "3.61e+09): rescale the trace or use --quantizer maxpow2")], ids=["nan", "beyond-scale"])
def test_a_trace_no_job_can_aggregate_fails_before_the_network_comes_up(tmp_path, value, args,
                                                                        error):
    """A gradient of nan, or one beyond every scale of the job's quantizer, is refused
    while the exact sums are made: one line, exit 1, a failed summary, and no switch or
    agent was started."""
    from qaina_bench.hosts.traces import write_trace
    grads = [[np.ones(15, np.float32)] for _ in range(4)]
    grads[3][0][7] = value
    write_trace(tmp_path / "traces" / "bad", grads, model="toy", dataset="random",
                layers=[("w", (15,))])
    proc = cli(tmp_path, "bad", "--iterations", "1", "--trace", str(tmp_path / "traces/bad"),
               *args)
    out, _ = proc.communicate(timeout=120)
    lines = out.decode().strip().splitlines()
    assert proc.returncode == 1 and "Traceback" not in out.decode()
    assert lines[-1] == "Error: " + error
    assert json.loads((tmp_path / "bad" / "summary.json").read_text())["status"] == "failed"
    assert not list((tmp_path / "bad" / "logs").glob("*")) and record_of("bad") is None
