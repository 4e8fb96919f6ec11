"""Agents started by forking one process that has already loaded them.

An agent process spends most of its start importing numpy and numba and loading its
compiled kernels (about 0.7 s of CPU each): a run of 16 agents on 2 cores waited
seconds for that alone. A run starts one *starter* per machine that has agents
(``harness/running/forkserver.py``), which imports the agent once and loads the
kernels while the network comes up; each agent is then a fork of it that enters its
Mininet host's namespaces (``setns``) and calls the agent's ``main(argv)``. Nothing
it computes is shared between agents or runs: each fork starts from the starter's
state, as a fresh process would from the disk cache.

* ``AgentStarter``: this machine's starter, spoken to over its standard input and
  output. ``Forked`` is the harness's handle of one of its forks, with
  ``subprocess.Popen``'s ``pid``, ``poll``, ``wait``, ``send_signal``, ``terminate``
  and ``kill``; signals go through a pidfd, so a PID the kernel reused is never
  signalled, and the fork's final CPU times come from the starter (``wait4``), as the
  harness is not its parent. When the harness goes (the pipe closes), the starter
  stops what it started and exits.
* ``Starters``: a run's starters: this machine's, and one on each other server of a
  cluster that has hosts, listening on an abstract unix socket there (for its own
  user only); ``remote launch --starter`` asks it for each agent, so that the harness
  keeps its ssh session per agent, its record and its stop as for any remote process.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path


class StarterError(OSError):
    """The starter process failed or exited (one line)."""


class Forked:
    """One process the starter forked: ``subprocess.Popen``'s interface for it."""

    def __init__(self, starter: "AgentStarter", pid: int):
        self.starter = starter
        self.pid = pid
        self.returncode: int | None = None
        self.final_times: tuple[float, float] | None = None  # (user, system) at exit
        try:
            self._pidfd = os.pidfd_open(pid)
        except OSError:  # gone already: its exit is on its way from the starter
            self._pidfd = None

    def poll(self) -> int | None:
        if self.returncode is None:
            ended = self.starter.exit_of(self.pid)
            if ended is not None:
                self.returncode, self.final_times = ended
                self._close()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(f"process {self.pid}", timeout)
            self.starter.wait_for_news(0.1 if left is None else min(left, 0.1))
        return self.returncode

    def send_signal(self, signum: int):
        if self.poll() is None and self._pidfd is not None:
            try:
                signal.pidfd_send_signal(self._pidfd, signum)
            except ProcessLookupError:
                pass

    def terminate(self):
        self.send_signal(signal.SIGTERM)

    def kill(self):
        self.send_signal(signal.SIGKILL)

    def _close(self):
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None


class AgentStarter:
    """The harness's end of one starter process (started at once; it loads the
    module meanwhile)."""

    def __init__(self, module: str, env: dict, log: Path):
        self.module = module
        self._log = open(log, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "qaina_bench.harness.running.forkserver", module], env=env, stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=self._log, start_new_session=True)
        self._news = threading.Condition()
        self._pids: dict[int, int] = {}  # request number -> PID
        self._exits: dict[int, tuple] = {}  # PID -> (status, (user, system))
        self._errors: dict[int, str] = {}  # request number -> why it was not started
        self._requests = 0
        self.loaded = False  # the starter said it has loaded the module
        self.gone = False
        self._reader = threading.Thread(target=self._read, daemon=True,
                                        name="agent starter")
        self._reader.start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_loaded(self, timeout: float = 300.0):
        """Until the starter has loaded its module (compiling the kernels where the
        disk cache lacks them can take a while on a busy machine)."""
        with self._news:
            self._await(lambda: self.loaded, timeout, f"load {self.module}")

    def start(self, argv: list[str], namespace_pid: int, log: Path,
              cgroups: list[str] = (), timeout: float = 60.0) -> Forked:
        """Fork a process that runs ``main(argv)`` of the starter's module in the
        namespaces of process ``namespace_pid`` (a Mininet host's shell) and in the
        cgroups ``cgroups`` (a CPU-limited host's), its output appended to ``log``;
        returns its handle once its PID is known."""
        self._requests += 1
        number = self._requests
        request = {"n": number, "argv": argv, "ns_pid": namespace_pid, "log": str(log),
                   "cgroups": list(cgroups)}
        try:
            self.proc.stdin.write(json.dumps(request).encode() + b"\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, ValueError):
            raise StarterError(self._why_gone()) from None

        def refused() -> str | None:
            if number in self._errors:
                return (f"the agent starter could not start {' '.join(argv)}: "
                        f"{self._errors.pop(number)}")
            return None
        with self._news:
            self._await(lambda: number in self._pids, timeout, "start a process", refused)
            return Forked(self, self._pids.pop(number))

    def _await(self, done, timeout: float, what: str, refused=lambda: None):
        """Wait, holding ``_news``, until ``done()``; raises ``StarterError`` with what
        ``refused()`` says, when the starter is gone, or after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while not done():
            why = refused() or (self._why_gone() if self.gone else None)
            if why:
                raise StarterError(why)
            left = deadline - time.monotonic()
            if left <= 0:
                raise StarterError(f"the agent starter did not {what} in {timeout:.0f} s "
                                   f"(log {self._log.name})")
            self._news.wait(min(left, 1.0))

    def death(self) -> StarterError | None:
        """The StarterError of a starter that has ended under the run, else None: its
        forks' exit statuses went with it (``exit_of`` counts them killed)."""
        code = self.proc.poll()
        if code is None:
            return None
        from .processes import how_ended
        return StarterError(f"the agent starter (pid {self.pid}) {how_ended(code)} while "
                            "its agents ran: how they ended is not known (log "
                            f"{self._log.name})")

    def exit_of(self, pid: int) -> tuple | None:
        """(exit status, (user, system) CPU seconds) of a fork that ended, else None;
        a fork the starter lost (it exited first) counts as killed (``death`` says
        why)."""
        with self._news:
            if pid in self._exits:
                return self._exits.pop(pid)
            if self.gone and not Path(f"/proc/{pid}").exists():
                return -signal.SIGKILL, None
        return None

    def wait_for_news(self, timeout: float):
        with self._news:
            self._news.wait(timeout)

    def close(self, timeout: float = 10.0):
        """End the starter: it stops whatever it started that still runs (TERM, and
        KILL after 5 s)."""
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._reader.join(timeout)
        self._log.close()

    def _read(self):
        for line in self.proc.stdout:
            try:
                news = json.loads(line)
                with self._news:
                    self._note(news)
                    self._news.notify_all()
            except (ValueError, KeyError, TypeError):
                continue  # not the starter's (a line it did not write)
        with self._news:
            self.gone = True
            self._news.notify_all()

    def _note(self, news: dict):
        if news.get("loaded"):
            self.loaded = True
        elif "pid" in news:
            self._pids[news["n"]] = news["pid"]
        elif "error" in news:
            self._errors[news["n"]] = news["error"]
        elif "exit" in news:
            self._exits[news["exit"]] = (news["status"], (news["user_s"], news["system_s"]))

    def _why_gone(self) -> str:
        try:
            code = self.proc.wait(2)
        except subprocess.TimeoutExpired:
            code = None
        return (f"the agent starter exited ({code if code is not None else 'pipe closed'});"
                f" see {self._log.name}")


class Starters:
    """A run's agent starters: this machine's (``local``, None where no agent runs
    here) and one on each other server of its cluster that has hosts (``remote``:
    server name -> the name of the abstract unix socket its starter listens on there).
    ``servers``: the names of the servers with hosts (None: every server)."""

    MODULE = "qaina_bench.hosts.agent"

    def __init__(self, log_dir: Path, record, cluster=None, name: str = "qaina-starter",
                 servers: set[str] | None = None):
        self.log_dir = Path(log_dir)
        self.record = record
        self.cluster = cluster
        self.name = name
        self.servers = servers
        self.local: AgentStarter | None = None
        self.remote: dict[str, str] = {}
        self._there: list[tuple] = []  # (server, ssh session, PID there)

    def start(self):
        """Start them all; each is recorded as soon as it exists."""
        from .cluster import launched
        from .processes import agent_env
        servers = [s for s in (self.cluster.servers if self.cluster is not None else [])
                   if self.servers is None or s.name in self.servers]
        if self.cluster is None or any(s.local for s in servers):
            self.local = AgentStarter(self.MODULE, agent_env(),
                                      self.log_dir / "agent-starter.log")
            self.record.add_process(self.local.pid, "starter of the agents")
        sessions = [(s, self._launch(s)) for s in servers if not s.local]
        for server, popen in sessions:
            try:
                pid, started = launched(popen)
            except ValueError as exc:
                raise StarterError(f"starting the agent starter on {server.name} failed: "
                                   f"{exc}") from None
            self.record.add_remote_process(server.name, server.user, pid, started,
                                           "starter of the agents")
            self._there.append((server, popen, pid))
            self.remote[server.name] = self.name

    def _launch(self, server) -> subprocess.Popen:
        """The starter on ``server`` through ``remote launch`` (recorded by its ssh
        session here until its PID there is known)."""
        from .cluster import agent_environment, remote_launch
        log = self.log_dir / f"agent-starter-{server.name}.log"
        sudo = ["sudo", "-E"] if server.user != "root" else []
        forkserver = [sys.executable, "-m", "qaina_bench.harness.running.forkserver",
                      "--listen", self.name, self.MODULE]
        cmd = server.ssh(*sudo, *remote_launch(log, forkserver, agent_environment()),
                         lasting=True)
        popen = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, start_new_session=True)
        self.record.add_process(popen.pid, f"ssh to starter of the agents on {server.name}")
        return popen

    def arguments(self, cmd: list[str]) -> list[str] | None:
        """The agent's arguments if ``cmd`` runs the agent in this Python, else None."""
        if cmd[:3] == [sys.executable, "-m", self.MODULE]:
            return cmd[3:]
        return None

    def wait_loaded(self):
        if self.local is not None:
            self.local.wait_loaded()

    def death(self) -> StarterError | None:
        """This machine's starter's ``death`` (the other servers' are not looked at)."""
        return self.local.death() if self.local is not None else None

    def stopped_pid(self) -> int | None:
        """This machine's starter's PID if it is stopped by a signal (the agents' exit
        statuses reach the run through it), else None."""
        from ..switches.targets import stopped
        local = self.local
        return local.pid if local is not None and stopped(local.pid) else None

    def close(self):
        """Every starter stopped (each stops what it started): this machine's, and the
        other servers' with TERM there (KILL after 8 s), all at once."""
        from .cluster import stop_script
        if self.local is not None:
            self.local.close()
        stops = [subprocess.Popen(
            server.ssh("sh", "-c", stop_script(pid, 8)),
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True) for server, _, pid in self._there]
        for popen in stops + [p for _, p, _ in self._there]:
            try:
                popen.wait(15)
            except subprocess.TimeoutExpired:
                popen.kill()
                popen.wait()
        self._there.clear()
