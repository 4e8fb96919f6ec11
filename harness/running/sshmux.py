"""One shared ssh connection per server of a cluster for a run's short commands.

Every ssh to a server pays a handshake (key exchange and login: 0.3-0.5 s each on a
busy machine), and a run on a cluster sends each server many short commands: tap
devices and their moves, free ports, the switches' guards, stopping processes, the
remote helper's calls, the checks of what is left. ``Masters`` keeps one master
connection per server open for the length of the run (OpenSSH's connection sharing,
``ssh -M -N``, its PID and control socket in the run record), and ``options`` gives
the ssh options that send a short command through it.

Long-lived sessions (node shells, switches, agents, tunnels, followers, samplers)
keep connections of their own: sshd takes 10 sessions per connection by default
(``MaxSessions``), and a server whose sshd takes fewer than ``MIN_SESSIONS`` gets no
shared connection (short commands of several threads may overlap). A command whose
master is gone (or never came up) connects on its own, as without sharing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time

#: (user, server) -> the control socket of that server's master connection
_SOCKETS: dict[tuple[str, str], str] = {}
#: the fewest sessions per connection a server's sshd must take for a shared one
MIN_SESSIONS = 4


def options(user: str, server: str) -> list[str]:
    """ssh options that run a command through the server's master connection (none
    when the run has no master there)."""
    path = _SOCKETS.get((user, server))
    return ["-o", f"ControlPath={path}"] if path else []


class Masters:
    """One master connection to each of ``servers`` (``cluster.Server``), for the run
    whose record is ``record``."""

    def __init__(self, servers, record, ssh: list[str]):
        self.servers = list(servers)
        self.record = record
        self.ssh = ssh  # the ssh command's words before the destination
        self.directory: str | None = None
        self.procs: list[tuple[tuple[str, str], subprocess.Popen]] = []

    def start(self, timeout: float = 15.0) -> list[str]:
        """Connect to every server; returns the ones no master came up for, or whose
        sshd takes too few sessions, each with why (their commands connect on their
        own)."""
        if not self.servers:
            return []
        self.directory = tempfile.mkdtemp(prefix="qaina-bench-ssh-")
        self.record.add_temp_directory(self.directory, last=True)
        waiting = []
        for k, server in enumerate(self.servers):
            socket = os.path.join(self.directory, str(k))
            popen = subprocess.Popen(
                self.ssh + ["-M", "-N", "-o", "ControlPersist=no", "-S", socket,
                            f"{server.user}@{server.name}"],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL, start_new_session=True)
            self.record.add_process(popen.pid, f"ssh master connection to {server.name}",
                                    last=True)
            key = (server.user, server.name)
            self.procs.append((key, popen))
            waiting.append((key, socket, popen))
        self.record.save()
        deadline = time.monotonic() + timeout
        while waiting and time.monotonic() < deadline:
            for item in list(waiting):
                key, socket, popen = item
                if os.path.exists(socket):  # made once the login is done
                    _SOCKETS[key] = socket
                    waiting.remove(item)
                elif popen.poll() is not None:
                    waiting.remove(item)
            time.sleep(0.02)
        unshared = [f"{key[1]} (no answer)" for key, _ in self.procs if key not in _SOCKETS]
        for server in self.servers:
            sessions = self._max_sessions(server)
            if sessions is not None and sessions < MIN_SESSIONS:
                _SOCKETS.pop((server.user, server.name))
                unshared.append(f"{server.name} (its sshd takes {sessions} sessions per "
                                "connection: MaxSessions)")
        return unshared

    def _max_sessions(self, server) -> int | None:
        """The server's sshd's MaxSessions, asked through its master (None: no master,
        or it did not say)."""
        if (server.user, server.name) not in _SOCKETS:
            return None
        try:
            res = subprocess.run(self.ssh + options(server.user, server.name) + [
                f"{server.user}@{server.name}", "sshd -T 2>/dev/null | sed -n "
                "'s/^maxsessions //p'"], capture_output=True, text=True, timeout=10)
            return int(res.stdout.split()[0])
        except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
            return None

    def stop(self):
        """Every master closed (the sessions through it end with it) and its socket's
        directory removed."""
        for key, popen in self.procs:
            _SOCKETS.pop(key, None)
            if popen.poll() is None:
                popen.terminate()
        for _, popen in self.procs:
            try:
                popen.wait(3)
            except subprocess.TimeoutExpired:
                popen.kill()
                popen.wait()
        self.procs = []
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None
