"""Mininet's own CLI on a live run: ``qaina-bench up --cli [before|after]``.

``before`` (plain ``--cli``): once the network is up and the switches programmed, before
any agent starts; leaving the CLI starts the jobs. ``after``: once the jobs ended (their
agents stopped), before the teardown; leaving the CLI tears down. The CLI is
``mininet.cli.CLI`` on the run's network (``h1 ping -c1 h2``, ``h1 tcpdump ...``,
``nodes``, ``net``, ``help``), with one command more, ``fresh`` (``RunShell``). Ctrl-C stops the command that runs and keeps the CLI (as
in ``mn``); ``exit``, ``quit`` or end of input leave it. SIGTERM or SIGHUP leaves it and ends the
run as usual.

What the user starts from the CLI is the run's too: after every command, each process
found under a node's shell or in a host's network namespace that the run did not
start itself is written to the run record (so ``qaina-bench clean`` removes it after a
``kill -9``), is left running while the jobs go (``before``: a ``tcpdump ... &``
captures them), and is stopped before the network goes down (``stop_by_hand``). On a
cluster, the nodes of another server are searched there (``remote strays``) and what
is found is recorded under that server.

``--cli after`` writes, for every agent, a copy of its configuration for starting it by
hand (``agents/cli/<name>.json``: records go to ``agents/cli/<name>.jsonl``, it starts at
once, the run's own records stay as they are); ``hand_command`` is the command line.
A job's slot copies keep its last uses, whose results would answer the first chunks of
a new stream as repeats; so they are freed before the CLI starts, and the CLI's
``fresh`` command frees them again (before every new start of a job's agents). Agents
by hand need the job's entries and no server: not with ``--arrivals`` (a job's entries
go when it leaves), ``--allocation shared`` or ``--mode ps`` (their hosts' servers are
stopped with the agents).
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import sys
from pathlib import Path

import psutil
from mininet.cli import CLI
from mininet.log import output

from ..switches.jobs import free_copies
from .processes import detach_terminal, hangup_handled, nudged
from .record import stop_processes

WHEN = ("before", "after")
#: what plain ``--cli`` means
DEFAULT = "before"


class Terminated(BaseException):
    """SIGTERM (or SIGHUP) while the CLI runs: Mininet's CLI catches KeyboardInterrupt,
    not this."""


def _terminated(signum, frame):
    if signum == signal.SIGHUP:
        detach_terminal()
    raise Terminated


def hand_command(config: Path, host: str) -> str:
    """The CLI line that starts an agent by hand from its configuration ``config``
    (the host's shell runs it: every path is quoted)."""
    agent = shlex.join([sys.executable, "-m", "qaina_bench.hosts.agent", str(config)])
    return f"{host} {agent} > {shlex.quote(str(config.with_suffix('.log')))} 2>&1 &"


def hand_configs(agents, directory: Path) -> list[tuple[str, Path]]:
    """For each agent (``AgentProcess``), a copy of its configuration that starts at
    once and writes its records under ``directory``: (host, path) pairs."""
    directory.mkdir(parents=True, exist_ok=True)
    out = []
    for a in agents:
        data = json.loads(Path(a.config.output).with_suffix(".json").read_text())
        name = f"j{a.job}w{a.worker}"
        data.update(output=str(directory / f"{name}.jsonl"), start_file=None)
        path = directory / f"{name}.json"
        path.write_text(json.dumps(data))
        out.append((a.host, path))
    return out


def fresh(run) -> list[str]:
    """Free every slot copy of ``run``'s jobs on the switches that aggregate them
    (``agg_count`` and ``agg_seen`` 0): the next contribution starts a new use."""
    if not run.mode.in_switch:
        return ["nothing to free: the switches only route in this mode"]
    out = []
    for job in run.jobs:
        for sw in run.testbed.placements(job, run.aggregator, run.cfg.network.levels):
            registers = run.testbed.net.get(sw).target.registers(run.testbed.conns[sw])
            out.append(f"job {job.job_id} on {sw}: {free_copies(registers, job.job_id)} "
                       "slot copies freed")
    return out


def hand_problem(run) -> str | None:
    """Why agents cannot be started by hand after ``run``'s jobs (None: they can)."""
    if run.admission is not None:
        return "with --arrivals a job's entries went when it left"
    if run.shared:
        return "the fallback hosts of --allocation shared were stopped with the agents"
    if run.mode.server is not None:
        return f"the {run.mode.server.label}s were stopped with the agents"
    return None


class RunShell(CLI):
    """Mininet's CLI with one command more, ``fresh``; after every command ``noted``
    is called (the run records what the command left running)."""

    def __init__(self, mininet, freshen=None, noted=None, **kw):
        self.freshen = freshen
        self.noted = noted
        super().__init__(mininet, **kw)

    def postcmd(self, stop, line):
        if self.noted is not None:
            self.noted()
        return stop

    def do_fresh(self, _line):
        """Free the jobs' slot copies, so that agents started by hand start afresh."""
        for line in (self.freshen() if self.freshen else ["nothing to free"]):
            output(line + "\n")


def _netns(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return None


def strays(shells: set[int], hosts: set[int], known: set[int]) -> list[psutil.Process]:
    """Processes of this machine started by hand: under a node's shell (``shells``), or in
    the network namespace of a host's shell (``hosts``), and not a shell or a process
    the run started (``known``, with what runs under them)."""
    skip = set(shells)
    for pid in known - shells:
        try:
            skip |= {pid} | {c.pid for c in psutil.Process(pid).children(recursive=True)}
        except psutil.Error:
            pass
    found: dict[int, psutil.Process] = {}
    for pid in shells:
        try:
            found.update({c.pid: c for c in psutil.Process(pid).children(recursive=True)})
        except psutil.Error:
            pass
    spaces = {_netns(pid) for pid in hosts} - {_netns(os.getpid()), None}
    for p in psutil.process_iter(["pid"]):
        if p.pid not in found and _netns(p.pid) in spaces:
            found[p.pid] = p
    return [p for pid, p in sorted(found.items()) if pid not in skip]


def by_hand(net, known: set[int]) -> list[psutil.Process]:
    """``strays`` among the nodes of ``net`` on this machine."""
    here = [n for n in net.values() if n.pid and getattr(n, "server_key", None) is None]
    return strays({n.pid for n in here}, {n.pid for n in here if n in net.hosts}, known)


def strays_there(node, shells: set[int], hosts: set[int], known: set[int]) -> list[dict]:
    """``strays`` on the server of ``node`` (a node of a cluster on another server), by
    ``remote strays`` there: ``{"pid", "started", "what"}`` each."""
    request = json.dumps({"shells": sorted(shells), "hosts": sorted(hosts),
                          "known": sorted(known)}, separators=(",", ":"))
    # one line for the server's shell (ssh joins the words), the request one word of it
    out = node.rcmd(shlex.join([sys.executable, "-m", "qaina_bench.harness.running.remote",
                                "strays", request]))
    found = []
    for line in out.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue  # the login's own noise
        if isinstance(entry, dict) and isinstance(entry.get("pid"), int):
            found.append(entry)
    return found


def stray_entries(shells: set[int], hosts: set[int], known: set[int]) -> list[dict]:
    """``strays`` as ``remote strays`` reports them."""
    out = []
    for p in strays(shells, hosts, known):
        try:
            started = p.create_time()
        except psutil.Error:
            continue  # ended
        out.append({"pid": p.pid, "started": started, "what": describe(p)})
    return out


def describe(p: psutil.Process) -> str:
    try:
        return " ".join(p.cmdline())[:80] or p.name()
    except psutil.Error:
        return f"pid {p.pid}"


class RunCLI:
    """Mininet's CLI on a run's network (``testbed``), with the run's record."""

    def __init__(self, testbed, record, echo=print, stdin=None):
        self.testbed = testbed
        self.record = record
        self.echo = echo
        self.stdin = stdin or sys.stdin
        self.started: list[psutil.Process] = []  # what the user started, recorded
        #: the same on other servers of a cluster: (server name, pid) -> (server, entry)
        self.started_there: dict[tuple[str, int], tuple] = {}
        self.freshen = None  # frees the jobs' slot copies (``fresh``), after the jobs

    def banner(self, when: str, run_id: str, aggregator: str | None,
               hand: list[tuple[str, Path]]) -> str:
        net = self.testbed.net
        hosts = " ".join(h.name for h in net.hosts)
        switches = " ".join(s.name + (" (aggregator)" if s.name == aggregator else "")
                            for s in net.switches)
        then = ("leaving it starts the jobs" if when == "before"
                else "the jobs ended; leaving it tears the network down")
        first, second = net.hosts[0].name, net.hosts[min(1, len(net.hosts) - 1)].name
        lines = [f"Mininet's CLI on run {run_id}, {when} the jobs: {then}.",
                 f"  hosts: {hosts}; switches: {switches}",
                 f"  e.g. {first} ping -c1 {second}  |  {first} tcpdump -ni {first}-eth0 -c 5 "
                 "udp port 20801  |  nodes  |  net  |  help",
                 "  Ctrl-C stops a command; exit, quit or Ctrl-D leave the CLI."]
        if hand:
            lines.append("  agents by hand: `fresh` (frees the jobs' slot copies), then "
                         f"every worker of a job (records in {hand[0][1].parent}):")
            lines += [f"    {hand_command(path, host)}" for host, path in hand[:4]]
            if len(hand) > 4:
                lines.append(f"    ... ({len(hand)} agents: {hand[0][1].parent}/*.json)")
        return "\n".join(lines)

    def run(self, when: str, run) -> bool:
        """The CLI on ``run`` (a ``Run``), ``when`` "before" or "after" its jobs; True if
        SIGTERM ended it."""
        hand, problem = [], hand_problem(run) if when == "after" else None
        if when == "after" and problem is None:
            hand = hand_configs(run.agents, run.writer.dir / "agents" / "cli")
            for _, path in hand:  # to the servers of a cluster, with the run's directory
                run.files.send(path, wait=False)
            run.files.settle()
            self.freshen = lambda: fresh(run)
            self.freshen()
        self.echo(self.banner(when, run.cfg.output.run_id, run.aggregator, hand))
        if problem:
            self.echo(f"  no agents by hand after these jobs: {problem}")
        return self.enter()

    def known(self) -> set[int]:
        """The PIDs the run's record lists: what the run started (and what the CLI's
        user started, once recorded)."""
        return {p["pid"] for p in self.record.data["processes"]}

    def enter(self) -> bool:
        """Run the CLI until the user leaves; True if SIGTERM or SIGHUP ended it. Then
        record what the user started."""
        ending = [signal.SIGTERM] + ([signal.SIGHUP] if hangup_handled() else [])
        previous = {s: signal.signal(s, _terminated) for s in ending}
        terminated = False
        try:
            with self.testbed.mininet_log.terminal(), nudged(signal.SIGINT, *ending):
                RunShell(self.testbed.net, freshen=self.freshen, noted=self._record,
                         stdin=self.stdin)
        except Terminated:
            terminated = True
            self.echo("\nterminated: leaving the CLI")
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
            self._record()
        running = [f"{describe(p)} (pid {p.pid})" for p in self.started if p.is_running()]
        running += self.running_there()
        if running:
            self.echo("started in the CLI, stopped at teardown: " + "; ".join(running))
        return terminated

    def _record(self):
        """Write what the user's commands left running to the run record (``clean``
        stops it after a ``kill -9``), on this machine and on every other server."""
        for p in by_hand(self.testbed.net, self.known()):
            self.started.append(p)
            self.record.add_process(p.pid, f"started in the CLI: {describe(p)}")
        for server, entry in self._there():
            key = (server.name, entry["pid"])
            if key not in self.started_there:
                self.started_there[key] = (server, entry)
                self.record.add_remote_process(server.name, server.user, entry["pid"],
                                               entry["started"],
                                               f"started in the CLI: {entry['what']}")

    def _there(self) -> list[tuple]:
        """(server, ``strays_there`` entry) on each other server of the run's cluster."""
        from .cluster import Server
        nodes: dict[str, list] = {}
        for node in self.testbed.net.values():
            if node.pid and getattr(node, "server_key", None) is not None:
                nodes.setdefault(node.server_key, []).append(node)
        out = []
        for name, members in nodes.items():
            part = self.record.data.get("servers", {}).get(name, {})
            known = {p["pid"] for p in part.get("processes", [])}
            server = Server(name, members[0].user)
            out += [(server, entry) for entry in strays_there(
                members[0], {n.pid for n in members},
                {n.pid for n in members if n in self.testbed.net.hosts}, known)]
        return out

    def running_there(self) -> list[str]:
        """What the CLI's user started on other servers, as the leaving line names it."""
        return [f"{entry['what']} (pid {pid} on {server.name})"
                for (_, pid), (server, entry) in self.started_there.items()]

    def stop_by_hand(self) -> tuple[list[str], list[str]]:
        """Stop what was started from the CLI (recorded or not), before the network
        goes down, here and on other servers; returns what was stopped, and what could
        not be (one line each: the run record keeps it for ``clean``)."""
        procs = {p.pid: p for p in self.started}
        procs.update({p.pid: p for p in by_hand(self.testbed.net, self.known())})
        stop_processes(list(procs.values()))
        out = [f"pid {pid}" for pid in procs]
        if not self.started_there and not self._has_remote_nodes():
            return out, []
        from .cluster import remote_resources
        there: dict[str, tuple] = {}
        for (name, pid), (server, entry) in self.started_there.items():
            there.setdefault(name, (server, {}))[1][pid] = entry
        try:
            for server, entry in self._there():  # started since the last command
                there.setdefault(server.name, (server, {}))[1][entry["pid"]] = entry
        except Exception as exc:  # a server gone: what was recorded is stopped below
            problems = [f"what the CLI started on other servers: not searched ({exc})"]
        else:
            problems = []
        for name, (server, entries) in there.items():
            said = remote_resources(server, "remove", {"processes": list(entries.values())})
            problems += [line for line in said if "failed there" in line
                         or "not reached" in line]
            out += [f"pid {pid} on {name}" for pid in entries]
        return out, problems

    def _has_remote_nodes(self) -> bool:
        return any(getattr(n, "server_key", None) is not None
                   for n in self.testbed.net.values())
