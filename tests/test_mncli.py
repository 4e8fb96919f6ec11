"""``qaina-bench up --cli``: Mininet's own CLI on a live run (as root, Mininet), driven
through its standard input as a user types: before the jobs (a ping, a process left
running, Ctrl-C, SIGTERM) and after them (agents started by hand), each run then
completing or ending and tearing down as always."""

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

import psutil
import pytest

from qaina_bench.harness.running.record import record_dir

CLI = [sys.executable, "-m", "qaina_bench.harness.cli"]
PROMPT = "mininet> "
needs_mininet = pytest.mark.skipif(shutil.which("mnexec") is None,
                                   reason="mnexec missing: apt-get install mininet")


class Session:
    """``up --cli`` with a pipe for its standard input: commands are written one at a
    time, each once the CLI prompts again, as a user types them."""

    def __init__(self, tmp_path: Path, run_id: str, *cli):
        self.dir = tmp_path / run_id
        self.run_id = run_id
        self.proc = subprocess.Popen(
            CLI + ["up", "--topo", "star", "--jobs", "1", "--workers", "2", "--iterations",
                   "2", "--results-dir", str(tmp_path), "--run-id", run_id, *cli],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, bufsize=1,  # SIGHUP as a terminal's session has it (not nohup's)
            preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL))
        os.set_blocking(self.proc.stdout.fileno(), False)
        self.out = ""

    def pump(self, done, timeout: float = 90) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.proc.stdout], [], [], 0.1)
            if ready:
                self.out += self.proc.stdout.read() or ""
            if done():
                return True
        return False

    def prompts(self) -> int:
        return self.out.count(PROMPT)

    def send(self, line: str):
        """Type ``line`` and wait for the next prompt."""
        before = self.prompts()
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        assert self.pump(lambda: self.prompts() > before), self.out

    def leave(self, line: str | None = "exit") -> int:
        if line is None:
            self.proc.stdin.close()  # end of input
        else:
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()
        assert self.pump(lambda: self.proc.poll() is not None, 180), self.out
        self.out += self.proc.stdout.read() or ""
        return self.proc.returncode

    def summary(self) -> dict:
        return json.loads((self.dir / "summary.json").read_text())

    def signal(self, signum):
        """Send ``signum`` to the run at its prompt, at once: it may come before the
        read of the next line has begun, or go to another of the run's threads."""
        self.proc.send_signal(signum)

    def kill(self):
        if self.proc.poll() is None:
            self.signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
                subprocess.run(CLI + ["clean"], capture_output=True, timeout=120)


def threads_of(pid: int) -> str:
    """Where each thread of ``pid`` waits, and the signals pending or blocked there
    (for a run that did not end)."""
    lines = []
    for task in sorted(Path(f"/proc/{pid}/task").glob("*")):
        try:
            status = dict(line.split(":\t", 1) for line in
                          (task / "status").read_text().splitlines() if ":\t" in line)
            call = (task / "syscall").read_text().split()[:2]
        except OSError:
            continue
        lines.append(f"  {task.name} {status.get('Name')} {status.get('State')} syscall "
                     f"{' '.join(call)} SigPnd {status.get('SigPnd')} ShdPnd "
                     f"{status.get('ShdPnd')} SigBlk {status.get('SigBlk')}")
    return "\nthreads:\n" + "\n".join(lines)


@pytest.fixture
def session(tmp_path):
    """Sessions whose results directory needs quoting in a shell (the lines the CLI
    prints are pasted into the hosts' shells)."""
    made = []
    results = tmp_path / "results $HOME dir"

    def start(run_id, *cli):
        made.append(Session(results, run_id, *cli))
        assert made[-1].pump(lambda: PROMPT in made[-1].out), made[-1].out
        return made[-1]
    yield start
    for s in made:
        s.kill()


def torn_down(s: Session):
    assert not (record_dir() / f"{s.run_id}.json").exists(), "the run record is left"
    left = set(s.summary()["interfaces"]) & set(psutil.net_if_addrs())
    assert not left, f"interfaces left: {left}"


@pytest.mark.root
@needs_mininet
def test_before_the_jobs_ping_then_exit_runs_the_jobs(session):
    s = session("cli-before", "--cli")  # plain --cli: before the jobs
    assert "before the jobs: leaving it starts the jobs" in s.out
    assert "iterations 0/" not in s.out  # no agent has started: no progress line
    s.send("h1 ping -c1 h2")
    assert "1 packets transmitted, 1 received" in s.out
    s.send("h2 sleep 300 &")  # left running: recorded, stopped at teardown
    s.signal(signal.SIGINT)  # Ctrl-C at the prompt keeps the CLI and the run
    assert s.pump(lambda: "Interrupt" in s.out and s.out.endswith(PROMPT)), s.out
    assert s.leave() == 0, s.out
    started = s.out.split("started in the CLI, stopped at teardown: ")[1].splitlines()[0]
    assert started.startswith("sleep 300 (pid ")
    pid = int(started.split("(pid ")[1].rstrip(")"))
    summary = s.summary()
    assert summary["status"] == "complete"
    assert summary["jobs"][0]["iterations_done"] == 2
    events = summary["events"]
    assert events["network_up"] < events["cli_before"] < events["agents_go"]
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie"
    torn_down(s)


@pytest.mark.root
@needs_mininet
@pytest.mark.parametrize("target", ["embedded", pytest.param("bmv2", marks=pytest.mark.bmv2)])
def test_after_the_jobs_agents_started_by_hand_aggregate_as_the_run_did(session, target):
    s = session(f"cli-after-{target}", "--cli", "after", "--target", target)
    assert "after the jobs: the jobs ended; leaving it tears the network down" in s.out
    assert "iterations 2/2" in s.out.split(PROMPT)[0]  # 1 job of 2 iterations
    hand = s.dir / "agents" / "cli"
    lines = [line.strip() for line in s.out.splitlines() if "-m qaina_bench.hosts.agent" in line]
    assert [line.split()[0] for line in lines] == ["h1", "h2"]
    for _ in range(2):  # again after `fresh`: the same aggregates
        s.send("fresh")
        assert "job 1 on s1: " in s.out.split(PROMPT)[-2]
        for line in lines:
            s.send(line)
        assert s.pump(lambda: all('"type": "done"' in (hand / f"j1w{w}.jsonl").read_text()
                                  for w in (0, 1) if (hand / f"j1w{w}.jsonl").exists())
                      and (hand / "j1w1.jsonl").exists(), 60)
        for w in (0, 1):
            by_hand = [json.loads(x) for x in open(hand / f"j1w{w}.jsonl")]
            ran = [json.loads(x) for x in open(s.dir / "agents" / f"j1w{w}.jsonl")]
            errors = [[r["rel_error"] for r in recs if r["type"] == "iteration"]
                      for recs in (by_hand, ran)]
            assert len(errors[0]) == 2 and errors[0] == pytest.approx(errors[1])
        (hand / "j1w0.jsonl").unlink()
        (hand / "j1w1.jsonl").unlink()
    assert s.leave(None) == 0, s.out  # end of input leaves, as exit does
    assert s.summary()["status"] == "complete"
    torn_down(s)


@pytest.mark.root
@needs_mininet
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["term", "hup"])
def test_sigterm_in_the_cli_ends_the_run_torn_down(session, signum):
    """SIGTERM, or SIGHUP (the terminal closed), at the CLI's prompt before the jobs:
    the run ends interrupted, its jobs never started."""
    s = session("cli-term", "--cli", "before")
    s.signal(signum)
    assert s.pump(lambda: s.proc.poll() is not None, 120), s.out + threads_of(s.proc.pid)
    s.out += s.proc.stdout.read() or ""
    assert s.proc.returncode == 130, s.out
    assert s.summary()["status"] == "interrupted"
    torn_down(s)


def test_cli_takes_before_or_after():
    r = subprocess.run(CLI + ["up", "--cli", "sideways"], capture_output=True, text=True)
    assert r.returncode == 2 and "'sideways' is not one of 'before', 'after'" in r.stderr
    r = subprocess.run(CLI + ["up", "--help"], capture_output=True, text=True)
    assert "--cli [before|after]" in r.stdout


@pytest.mark.root
@needs_mininet
def test_what_the_cli_started_is_recorded_and_cleaned_after_kill_9(session):
    s = session("cli-kill", "--cli", "before")
    s.send("h1 nohup sleep 300 > /dev/null 2>&1 &")  # outlives its shell
    record = json.loads((record_dir() / "cli-kill.json").read_text())
    started = [p for p in record["processes"] if p["what"] == "started in the CLI: sleep 300"]
    assert len(started) == 1 and psutil.pid_exists(started[0]["pid"])
    s.proc.kill()
    s.proc.wait(30)
    r = subprocess.run(CLI + ["clean"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"stopped started in the CLI: sleep 300 (pid {started[0]['pid']})" in r.stdout
    assert not psutil.pid_exists(started[0]["pid"]) or \
        psutil.Process(started[0]["pid"]).status() == "zombie"
    assert not (record_dir() / "cli-kill.json").exists()


@pytest.mark.root
def test_remote_strays_lists_what_runs_by_hand_in_a_hosts_namespace():
    """What a server of a cluster answers about its nodes (``remote strays``)."""
    host = subprocess.Popen(["unshare", "--net", "--fork", "--kill-child", "sleep", "120"])
    hand = None
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not psutil.Process(host.pid).children():
            time.sleep(0.05)
        hand = subprocess.Popen(["nsenter", "-t", str(host.pid), "-n", "sleep", "121"])
        time.sleep(0.3)

        def strays(request) -> subprocess.CompletedProcess:
            return subprocess.run([sys.executable, "-m", "qaina_bench.harness.running.remote",
                                   "strays", request], capture_output=True, text=True,
                                  timeout=60)
        res = strays(json.dumps({"shells": [], "hosts": [host.pid], "known": [host.pid]}))
        found = [json.loads(line) for line in res.stdout.splitlines()]
        assert res.returncode == 0 and [(e["pid"], e["what"]) for e in found] == \
            [(hand.pid, "sleep 121")], res.stdout + res.stderr
        assert found[0]["started"] == psutil.Process(hand.pid).create_time()
        res = strays(json.dumps({"shells": [], "hosts": [host.pid],
                                 "known": [host.pid, hand.pid]}))
        assert res.returncode == 0 and not res.stdout, res.stdout
        for bad in ("[1, 2]", "{\"shells\": [1]}", "not json", "{\"shells\": [\"x\"], "
                    "\"hosts\": [], \"known\": []}"):
            res = strays(bad)
            assert res.returncode == 2 and not res.stdout, (bad, res.stdout)
            assert len(res.stderr.strip().splitlines()) == 1 and "strays:" in res.stderr
    finally:
        for p in (hand, host):
            if p is not None:
                p.kill()
                p.wait()
