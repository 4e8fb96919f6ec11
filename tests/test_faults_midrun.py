"""Faults while a run's jobs run, as root: a switch or an agent killed or stopped, a
switch that dies while the network is held, a results folder that fills up or is
removed. Each is one line naming the cause, and afterwards nothing the run started
is left."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from test_faults import cli, leftovers, read_until, record_of, wait_for

pytestmark = [
    pytest.mark.root,  # Mininet
    pytest.mark.skipif(shutil.which("mnexec") is None,
                       reason="mnexec missing: apt-get install mininet"),
]


def fault_mid_run(tmp_path, run_id, fault, *args, agents: int = 4) -> tuple[int, str, dict]:
    """Start a run whose jobs last (``args``: more options), call ``fault(record)`` once
    its ``agents`` agents are in its record and started, and return the CLI's exit
    status, its output and that record."""
    proc = cli(tmp_path, run_id, "--iterations", "12", "--bits", "32", "--bw", "0.5", *args)
    try:
        wait_for(lambda: (r := record_of(run_id)) and
                 sum(p["what"].startswith("agent") for p in r["processes"]) == agents
                 and (tmp_path / run_id / "agents" / "go").exists(),
                 timeout=180, what=f"{agents} agents in the run record, started")
        record = record_of(run_id)
        fault(record)
        out, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
        proc.wait()
    return proc.returncode, out.decode(), record


@pytest.mark.parametrize("victim, signum, line", [
    ("agent j1w2 ", signal.SIGKILL, "Error: agent j1w2 on h3 was killed by SIGKILL: "),
    ("switch s1", signal.SIGKILL, "Error: s1 (embedded) was killed by SIGKILL; its log "),
    ("switch s1", signal.SIGSTOP, "Error: s1 (embedded) is stopped by a signal (pid "),
    ("starter of the agents", signal.SIGKILL, "Error: the agent starter (pid "),
    ("switch s1", signal.SIGKILL, "Error: s1 (embedded) was killed by SIGKILL; its log "),
], ids=["agent", "switch", "switch-stopped", "starter", "switch-of-16-ports"])
def test_a_process_killed_mid_run_is_named_with_its_signal_and_nothing_is_left(
        tmp_path, request, victim, signum, line):
    """kill -9 of one agent, of the switch or of the agents' starter, or a SIGSTOP of
    the switch, while the jobs run: the run fails in one line naming it and the signal
    (not the P4Runtime error the sampler met: UNAVAILABLE, or DEADLINE_EXCEEDED after
    10 s; not an agent "killed" whose end went with its starter), its summary says
    failed, and everything else it started is gone (a stopped switch, orphaned
    agents too)."""
    def kill(record):
        os.kill(next(p["pid"] for p in record["processes"] if p["what"].startswith(victim)),
                signum)

    # 16 ports: the kernel takes a good part of a second to close a killed switch's
    # packet sockets, past the moment the sampler's read fails
    more = ["--jobs", "4"] if request.node.callspec.id == "switch-of-16-ports" else []
    code, text, record = fault_mid_run(tmp_path, "killed-mid-run", kill, *more,
                                       agents=16 if more else 4)
    assert code == 1, text
    assert line in text and "Traceback" not in text, text
    if victim.startswith("starter"):  # said at once, not when the agents are done
        assert ("was killed by SIGKILL while its agents ran: how they ended is not known"
                in text and "iterations 12/12" not in text), text
    summary = json.loads((tmp_path / "killed-mid-run" / "summary.json").read_text())
    assert summary["status"] == "failed"
    assert record_of("killed-mid-run") is None and leftovers(record) == []


def test_a_run_past_its_timeout_names_the_agents_still_running_and_a_stopped_one(tmp_path):
    """One agent stopped (SIGSTOP): its job cannot end, the run stops at --timeout and
    its line lists the agents still running, the stopped one said so."""
    def stop(record):
        os.kill(next(p["pid"] for p in record["processes"]
                     if p["what"].startswith("agent j1w2 ")), signal.SIGSTOP)

    code, text, record = fault_mid_run(tmp_path, "stalled", stop, "--timeout", "8")
    assert code == 1, text
    line = next((x for x in text.splitlines() if "exceeded --timeout" in x), text)
    assert line.startswith("run exceeded --timeout 8 s; still running: "), line
    assert "j1w2 on h3 (" in line and "iterations, stopped by a signal)" in line, line
    assert line.count("stopped by a signal") == 1
    summary = json.loads((tmp_path / "stalled" / "summary.json").read_text())
    assert summary["status"] == "timeout"
    assert record_of("stalled") is None and leftovers(record) == []


def test_a_stopped_starter_is_named_at_the_timeout_and_nothing_is_left(tmp_path):
    """The agents' starter stopped (SIGSTOP): the agents' exit statuses reach the run
    through it, so the run stops at --timeout, and its line names the stopped starter
    instead of calling the agents still running."""
    def stop(record):
        os.kill(next(p["pid"] for p in record["processes"]
                     if p["what"] == "starter of the agents"), signal.SIGSTOP)

    code, text, record = fault_mid_run(tmp_path, "starter-stopped", stop, "--timeout", "8")
    assert code == 1, text
    line = next((x for x in text.splitlines() if "exceeded --timeout" in x), text)
    assert line.startswith("run exceeded --timeout 8 s; the agent starter (pid "), line
    assert ") is stopped by a signal, so how these ended is not known: j1w0 on h1 (" in line
    assert "still running" not in line, line
    assert record_of("starter-stopped") is None and leftovers(record) == []


@pytest.mark.parametrize("end, says", [
    ("switch", "run exceeded --timeout 8 s; still running: j1w0 on h1 ("),
    ("host", "Error: agent j1w1 on h2 exited with 1: OSError: [Errno 101] Network is "
             "unreachable (log ")])
def test_a_link_taken_down_at_either_end_is_named_with_what_it_stopped(tmp_path, end, says):
    """A link set down while the jobs run, at the switch's end (the jobs stall: the
    timeout's line) or inside the host's namespace (its agent's socket fails: the
    error's line): the line says which link is not up."""
    def down(record):
        if end == "switch":
            cmd = ["ip", "link", "set", "s1-eth2", "down"]
        else:  # in h2's namespace, through its shell's PID
            shell = next(p["pid"] for p in record["processes"] if p["what"] == "mininet shell h2")
            cmd = ["mnexec", "-a", str(shell), "ip", "link", "set", "h2-eth0", "down"]
        subprocess.run(cmd, check=True, timeout=30)

    code, text, record = fault_mid_run(tmp_path, "link-down", down, "--timeout", "8")
    assert code == 1, text
    line = next((x for x in text.splitlines() if "links not up" in x), text)
    assert says in line and line.endswith("; links not up: s1-eth2 to h2 (down)"), line
    if end == "host":  # on a line of its own, not after the progress line
        assert any(x.startswith("results so far: ") for x in text.splitlines()), text
    else:  # said as it happened, on a line of its own, before the timeout's
        lines = text.splitlines()
        said = [i for i, x in enumerate(lines) if x.startswith("  link s1-eth2 to h2 is down (")]
        assert len(said) == 1 and said[0] < lines.index(line), text
        assert lines[said[0]].endswith(" s): the jobs that cross it wait for it; their "
                                       "agents give up after 30 s without a result"), text
        summary = json.loads((tmp_path / "link-down" / "summary.json").read_text())
        [outage] = summary["link_outages"]
        assert (outage["link"], outage["state"], outage["up_s"]) == ("s1-eth2 to h2", "down",
                                                                     None), outage
        assert (f"link s1-eth2 to h2 was down from {outage['down_s']:.1f} s until the jobs "
                "ended after the jobs started: the iterations it held up measure the "
                "outage") in summary["validity"]["warnings"], summary["validity"]
    assert record_of("link-down") is None and leftovers(record) == []


def test_a_link_that_goes_down_and_comes_back_is_said_both_times_and_warned_of(tmp_path):
    """A switch's link down for 2 s while the jobs run: said when it goes and when it
    comes back, the jobs then complete (their agents retransmit what it lost), and the
    summary keeps the outage, with a warning that its iterations measure it."""
    def flap(record):
        subprocess.run(["ip", "link", "set", "s1-eth2", "down"], check=True, timeout=30)
        time.sleep(2.0)
        subprocess.run(["ip", "link", "set", "s1-eth2", "up"], check=True, timeout=30)

    code, text, record = fault_mid_run(tmp_path, "link-flap", flap)
    assert code == 0, text
    lines = text.splitlines()
    down = [x for x in lines if x.startswith("  link s1-eth2 to h2 is down (")]
    up = [x for x in lines if x.startswith("  link s1-eth2 to h2 is up again (")]
    assert len(down) == 1 and len(up) == 1 and lines.index(down[0]) < lines.index(up[0]), text
    summary = json.loads((tmp_path / "link-flap" / "summary.json").read_text())
    assert summary["status"] == "complete"
    [outage] = summary["link_outages"]
    assert outage["link"] == "s1-eth2 to h2" and outage["state"] == "down"
    assert 0.8 <= outage["up_s"] - outage["down_s"] <= 8.0, outage  # looked at once a second
    assert (f"link s1-eth2 to h2 was down from {outage['down_s']:.1f} s to "
            f"{outage['up_s']:.1f} s after the jobs started: the iterations it held up "
            "measure the outage") in summary["validity"]["warnings"]
    assert record_of("link-flap") is None and leftovers(record) == []


@pytest.mark.parametrize("node, signum, said", [
    ("h2", signal.SIGKILL, "ended before the teardown (status -9)"),
    ("s1", signal.SIGKILL, "ended before the teardown (status -9)"),
    ("h2", signal.SIGSTOP, "within 15 s (stopped by a signal) and was killed"),
], ids=["h2", "s1", "h2-stopped"])
def test_a_nodes_shell_killed_or_stopped_mid_run_leaves_the_run_to_end_and_nothing_behind(
        tmp_path, node, signum, said):
    """kill -9 or SIGSTOP of a Mininet node's shell (a host's or the switch's) while the
    jobs run: the jobs go on through the processes already started, and the teardown
    does not wait for ever on the shell that cannot answer (Mininet deletes each link
    through both ends' shells; a stopped one is killed after 15 s, and the terminal and
    the summary say so); mininet.log says it was skipped."""
    def kill(record):
        os.kill(next(p["pid"] for p in record["processes"]
                     if p["what"] == f"mininet shell {node}"), signum)

    code, text, record = fault_mid_run(tmp_path, "shell-killed", kill, "--iterations", "4")
    assert code == 0 and "shell-killed: complete" in text, text
    log = (tmp_path / "shell-killed" / "logs" / "mininet.log").read_text()
    assert f"*** {node}'s shell (pid " in log and said in log, log
    assert "its commands are skipped" in log, log
    # one given up on in the teardown is said on the terminal and in the summary
    summary = json.loads((tmp_path / "shell-killed" / "summary.json").read_text())
    given_up = [e for e in summary["errors"] if e.startswith(f"teardown: {node}'s shell")]
    assert len(given_up) == (1 if signum == signal.SIGSTOP else 0), summary["errors"]
    assert all(line in text for line in given_up), text
    assert record_of("shell-killed") is None and leftovers(record) == []


def test_a_switch_that_dies_while_a_run_is_held_is_named_and_ctrl_c_still_ends_it(tmp_path):
    """`up --hold`: a switch killed while the network is held is said once (what is
    left stays up); the Ctrl-C that ends the hold tears everything down."""
    proc = cli(tmp_path, "held-dies", "--iterations", "1", "--hold")
    try:
        out = read_until(proc, b"stays up until Ctrl-C", timeout=120)
        assert b"stays up until Ctrl-C" in out, out.decode()
        record = record_of("held-dies")
        os.kill(next(p["pid"] for p in record["processes"] if p["what"] == "switch s1"),
                signal.SIGKILL)
        out += read_until(proc, b"the rest stays up until Ctrl-C", timeout=30)
        assert b"s1 (embedded) was killed by SIGKILL; its log " in out, out.decode()
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 0, (out + rest).decode()
    assert record_of("held-dies") is None and leftovers(record) == []


def test_a_results_directory_that_fills_up_is_one_line_and_nothing_is_left(tmp_path):
    """Results on a 64 KiB file system: the run fails in one line saying where and why
    (not a bare errno), and its network, switch and agents are gone."""
    tiny = tmp_path / "tiny"
    tiny.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(tiny)], check=True)
    try:
        proc = cli(tiny, "full", "--iterations", "6", "--trace", "digits-mlp-wide")
        out, _ = proc.communicate(timeout=300)
        record = record_of("full")
    finally:
        subprocess.run(["umount", str(tiny)], check=True)
    text = out.decode()
    assert proc.returncode == 1, text
    assert (f"Error: cannot write the results in {tiny / 'full'}: No space left on device "
            "(free space there or choose another --results-dir)") in text, text
    assert "Traceback" not in text and record is None
    assert not any(Path(f"/sys/class/net/s1-eth{i}").exists() for i in range(1, 5))


@pytest.mark.parametrize("by", ["removed", "a file"])
def test_a_result_set_removed_during_the_run_is_one_line_and_nothing_is_left(tmp_path, by):
    """The run's folder removed (moved away, atomic unlike rm -rf), or replaced by a
    file, while its jobs run: one line saying so, not a bare errno, and everything it
    started is gone."""
    def fault(_):
        (tmp_path / "removed").rename(tmp_path / "elsewhere")
        if by == "a file":
            (tmp_path / "removed").write_text("not a folder")
    code, text, record = fault_mid_run(tmp_path, "removed", fault)
    assert code == 1, text
    said = "was removed while the run went" if by == "removed" else (
        "was replaced by something that is no folder while the run went")
    assert f"Error: the result set {tmp_path / 'removed'} {said}" in text, text
    assert "Traceback" not in text
    assert record_of("removed") is None and leftovers(record) == []


def test_a_process_killed_but_not_reaped_is_dying_and_a_running_or_stopped_one_is_not():
    """``dying``: what a failing run waits on before it says how a switch ended."""
    from qaina_bench.harness.switches.targets import dying
    proc = subprocess.Popen(["sleep", "60"])
    try:
        assert not dying(proc.pid)
        os.kill(proc.pid, signal.SIGSTOP)
        wait_for(lambda: Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
                 == "T", what="the process stopped")
        assert not dying(proc.pid)
        os.kill(proc.pid, signal.SIGKILL)  # not waited for: a zombie until reaped
        wait_for(lambda: dying(proc.pid), what="the process a zombie")
    finally:
        proc.kill()
        proc.wait()
    assert not dying(proc.pid)  # reaped: no such process
