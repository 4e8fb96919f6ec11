"""Shared ssh connections to the servers of a cluster, for the length of a run.

Every ssh to a server pays a handshake (key exchange and login: 0.3-0.5 s each on a
busy machine), and a run opens many: a shell per node, a session per remote switch,
agent, tunnel, follower and sampler, and short commands by the dozen (tap devices and
their moves, free ports, the switches' guards, stopping processes, the remote
helper's calls, the checks of what is left). ``Masters`` opens master connections
(OpenSSH's connection sharing, ``ssh -M -N``; each one's PID and the directory of
their control sockets in the run record, ended after everything else) and
``options`` gives the ssh options that send a session through one:

* short commands share one master per server;
* lasting sessions share further masters, a few each: sshd takes 10 sessions per
  connection by default (``MaxSessions``), so each lasting master takes at most that
  less 2, and at most ``PER_MASTER``; a server whose sshd takes fewer than
  ``MIN_SESSIONS`` gets no shared connection at all.

A session whose master did not come up (or is gone) connects on its own, as
without sharing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
import time

#: the run's masters (set by ``Masters.start``, cleared by ``stop``)
_ACTIVE: "Masters | None" = None
#: the fewest sessions per connection a server's sshd must take for sharing
MIN_SESSIONS = 4
#: the most lasting sessions one master carries
PER_MASTER = 8


def options(user: str, server: str, lasting: bool = False) -> list[str]:
    """ssh options that send a session to ``server`` through one of the run's master
    connections (none when the run has none there). ``lasting``: the session stays
    open (a shell, a process's session), not a short command."""
    masters = _ACTIVE
    path = masters.socket_for(user, server, lasting) if masters is not None else None
    return ["-o", f"ControlPath={path}"] if path else []


class Masters:
    """The master connections to ``servers`` (``cluster.Server``) of the run whose
    record is ``record``; ``ssh``: the ssh command's words before the destination."""

    def __init__(self, servers, record, ssh: list[str]):
        self.servers = {(s.user, s.name): s for s in servers}
        self.record = record
        self.ssh = ssh
        self.directory: str | None = None
        self.procs: list[subprocess.Popen] = []
        self.short: dict[tuple[str, str], str] = {}  # server -> its short commands' socket
        self.lasting: dict[tuple[str, str], list[list]] = {}  # -> [socket, sessions]
        self.capacity: dict[tuple[str, str], int] = {}  # lasting sessions per master
        self.lock = threading.Lock()

    def start(self, timeout: float = 15.0) -> list[str]:
        """Connect to every server; returns those that share no connection, each with
        why (their sessions connect on their own)."""
        global _ACTIVE
        if not self.servers:
            return []
        self.directory = tempfile.mkdtemp(prefix="qaina-bench-ssh-")
        self.record.add_temp_directory(self.directory, last=True)
        opened = {key: self._open(key) for key in self.servers}
        up = self._wait(list(opened.values()), timeout)
        unshared = []
        for key, (socket, _) in opened.items():
            if socket not in up:
                unshared.append(f"{key[1]} (no answer)")
                continue
            sessions = self._max_sessions(key, socket)
            if sessions is not None and sessions < MIN_SESSIONS:
                unshared.append(f"{key[1]} (its sshd takes {sessions} sessions per "
                                "connection: MaxSessions)")
                continue
            self.short[key] = socket
            self.lasting[key] = []
            self.capacity[key] = min(PER_MASTER, (sessions or 10) - 2)
        _ACTIVE = self
        return unshared

    def socket_for(self, user: str, server: str, lasting: bool) -> str | None:
        """The control socket a session to ``server`` goes through (None: on its own);
        a lasting one takes a place in a master that has one, or in a new master."""
        key = (user, server)
        if key not in self.short:
            return None
        if not lasting:
            return self.short[key]
        with self.lock:
            for entry in self.lasting[key]:
                if entry[1] < self.capacity[key]:
                    entry[1] += 1
                    return entry[0]
            socket, popen = self._open(key)
            if not self._wait([(socket, popen)], 15.0):
                return None
            self.lasting[key].append([socket, 1])
            return socket

    def _open(self, key: tuple[str, str]) -> tuple[str, subprocess.Popen]:
        """A new master to server ``key`` (recorded), and its control socket's path."""
        socket = os.path.join(self.directory, str(len(self.procs)))
        popen = subprocess.Popen(
            self.ssh + ["-M", "-N", "-o", "ControlPersist=no", "-S", socket,
                        f"{key[0]}@{key[1]}"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True)
        self.procs.append(popen)
        self.record.add_process(popen.pid, f"ssh master connection to {key[1]}", last=True)
        return socket, popen

    @staticmethod
    def _wait(opened: list[tuple[str, subprocess.Popen]], timeout: float) -> set[str]:
        """The sockets of ``opened`` masters that came up within ``timeout``."""
        up: set[str] = set()
        waiting = list(opened)
        deadline = time.monotonic() + timeout
        while waiting and time.monotonic() < deadline:
            for socket, popen in list(waiting):
                if os.path.exists(socket):  # made once the login is done
                    up.add(socket)
                    waiting.remove((socket, popen))
                elif popen.poll() is not None:
                    waiting.remove((socket, popen))
            time.sleep(0.02)
        return up

    def _max_sessions(self, key: tuple[str, str], socket: str) -> int | None:
        """The server's sshd's MaxSessions, asked through its master (None: it did
        not say)."""
        try:
            res = subprocess.run(
                self.ssh + ["-o", f"ControlPath={socket}", f"{key[0]}@{key[1]}",
                            "sshd -T 2>/dev/null | sed -n 's/^maxsessions //p'"],
                capture_output=True, text=True, timeout=10)
            return int(res.stdout.split()[0])
        except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
            return None

    def stop(self):
        """Every master closed (the sessions through them end with them) and their
        sockets' directory removed."""
        global _ACTIVE
        if _ACTIVE is self:
            _ACTIVE = None
        self.short.clear()
        self.lasting.clear()
        for popen in self.procs:
            if popen.poll() is None:
                popen.terminate()
        for popen in self.procs:
            try:
                popen.wait(3)
            except subprocess.TimeoutExpired:
                popen.kill()
                popen.wait()
        self.procs = []
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None
