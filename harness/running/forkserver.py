"""The agent starter's own process: ``python -m qaina_bench.harness.running.forkserver
[--listen NAME] MODULE``.

It imports MODULE once (the agent's: with its kernels loaded, compiled where the disk
cache lacks them), then forks a process per request that enters a Mininet host's
namespaces and calls ``MODULE.main(argv)`` there (``harness/running/starter.py`` is
the harness's side). Requests and news are JSON lines:

* request: ``{"n", "argv", "ns_pid", "log"}`` and optionally ``"cgroups"`` (a list of
  cgroup v1 directories): fork, join those cgroups (as ``mnexec -g`` does; a
  CPU-limited host's), enter the namespaces of process ``ns_pid``, output appended
  to ``log``;
* news: ``{"loaded": true}`` once MODULE is loaded; ``{"n", "pid"}`` (or ``{"n",
  "error"}``) per request; ``{"exit": pid, "status", "user_s", "system_s"}`` when a
  fork ends (its exit status as ``subprocess`` gives it, and its CPU times from
  ``wait4``).

Without ``--listen`` the requests come on standard input and the news go to standard
output; when standard input closes (the harness ended, or was killed) every fork still
running is stopped and the process exits. With ``--listen NAME`` (a server of a
cluster, ``remote launch --starter``) each connection to the abstract unix socket NAME
brings requests and gets the news of its own forks; a connection from a process of
another user is closed unread (the socket has no file permissions, and a fork runs
as the starter's user). A request that is not one (a field missing or of the wrong
type) gets an ``error`` and no fork. SIGTERM stops every fork and ends the process
in either mode.
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
import select
import signal
import socket
import struct
import sys
import time

CLONE_NEWNS = 0x00020000
CLONE_NEWNET = 0x40000000


def _setns(path: str, kind: int):
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY)
    try:
        if libc.setns(fd, kind) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns {path}: {os.strerror(err)}")
    finally:
        os.close(fd)


def _enter(ns_pid: int):
    """Join the network namespace of ``ns_pid`` (and its mount namespace where it has
    one of its own), as ``mnexec -a`` does, in the same working directory."""
    cwd = os.getcwd()
    for kind, flag in (("net", CLONE_NEWNET), ("mnt", CLONE_NEWNS)):
        there = f"/proc/{ns_pid}/ns/{kind}"
        if os.stat(there).st_ino != os.stat(f"/proc/self/ns/{kind}").st_ino:
            _setns(there, flag)
    os.chdir(cwd)


def _join(cgroups: list[str]):
    """Move this process into every cgroup of ``cgroups`` (v1 directories)."""
    for directory in cgroups:
        with open(os.path.join(directory, "tasks"), "w") as tasks:
            tasks.write(f"{os.getpid()}\n")


def problem(request) -> str | None:
    """Why ``request`` is not a request a fork can be made for (None: it is)."""
    if not isinstance(request, dict):
        return "a request is a JSON object"
    fields = {"argv": list, "ns_pid": int, "log": str, "cgroups": list}
    for name, kind in fields.items():
        value = request.get(name, [] if name == "cgroups" else None)
        if not isinstance(value, kind) or isinstance(value, bool):
            return f"{name} must be a {kind.__name__}"
    if not all(isinstance(a, str) for a in request["argv"] + request.get("cgroups", [])):
        return "argv and cgroups hold strings"
    return None


def _child(main, request: dict, inherited: set[int]) -> int:
    """In the fork: the output, the cgroups, the namespaces, then ``main``; returns
    its status (what fails before the output is redirected goes to the starter's)."""
    try:
        os.setsid()
        signal.set_wakeup_fd(-1)
        for signum in (signal.SIGCHLD, signal.SIGTERM):
            signal.signal(signum, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        for fd in inherited | {log, null}:
            os.close(fd)
        _join(request.get("cgroups") or [])
        _enter(request["ns_pid"])
    except BaseException as exc:  # noqa: BLE001 - the fork must never return
        print(f"agent starter: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    try:
        return main(request["argv"]) or 0
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1
    except BaseException as exc:  # noqa: BLE001 - what the process's own would say last
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


def _load(module_name: str):
    """Import the module (the agent's: with its kernels loaded, compiled where the
    disk cache lacks them) and keep what is loaded out of later collections, so that
    a fork's collector does not touch (and so copy) the pages it shares with the
    starter."""
    import importlib
    module = importlib.import_module(module_name)
    if module_name == "qaina_bench.hosts.agent":
        from ...hosts import kernels
        kernels.warm()
    gc.freeze()
    return module


class _Stop(Exception):
    """SIGTERM: stop every fork and end."""


def _stop(signum, frame):
    raise _Stop


class ForkServer:
    """The loop: requests in, forks out, news back to whoever asked."""

    def __init__(self, module, listener: socket.socket | None):
        self.module = module
        self.listener = listener
        self.running: dict[int, object] = {}  # fork PID -> where its news go
        self.peers: dict[int, list] = {}  # fd -> [bytes not yet a line, say, socket]
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.set_wakeup_fd(self.wake_w)

    @staticmethod
    def sayer(write):
        def say(**news):
            try:
                write(json.dumps(news).encode() + b"\n")
            except OSError:  # whoever asked is gone: its forks are stopped by the run
                pass
        return say

    def serve(self):
        """Until standard input closes (not listening) or SIGTERM (listening)."""
        try:
            while True:
                fds = [self.wake_r, *self.peers] + ([self.listener] if self.listener else [])
                ready = select.select(fds, [], [])[0]
                if self.wake_r in ready:
                    os.read(self.wake_r, 512)
                    self.reap()
                if self.listener is not None and self.listener in ready:
                    self.accept()
                for fd in [fd for fd in ready if fd in self.peers]:
                    if not self.read(fd):
                        return
        except _Stop:
            pass
        finally:
            self.stop_all()

    def accept(self):
        """A connection, kept when its peer runs as this process's user."""
        conn, _ = self.listener.accept()
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        if struct.unpack("3i", creds)[1] != os.geteuid():
            conn.close()
            return
        self.peers[conn.fileno()] = [b"", self.sayer(conn.sendall), conn]

    def read(self, fd: int) -> bool:
        """A peer's requests; False when standard input has closed."""
        pending, say, conn = self.peers[fd]
        data = os.read(fd, 65536)
        if not data:
            del self.peers[fd]
            if conn is not None:
                conn.close()
            return conn is not None  # standard input closed: the harness went
        *lines, self.peers[fd][0] = (pending + data).split(b"\n")
        for line in lines:
            try:
                request = json.loads(line)
            except ValueError:
                continue
            self.fork(request, say)
        return True

    def fork(self, request: dict, say):
        why = problem(request)
        if why is not None:
            say(n=request.get("n") if isinstance(request, dict) else None,
                error=f"not a request: {why}")
            return
        sys.stdout.flush()
        # SIGTERM waits until the fork is listed (then stopped with the others)
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        try:
            pid = os.fork()
        except OSError as exc:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
            say(n=request.get("n"), error=str(exc))
            return
        if pid == 0:
            inherited = {self.wake_r, self.wake_w, *(fd for fd in self.peers if fd > 2)}
            if self.listener is not None:
                inherited.add(self.listener.fileno())
            code = 1
            try:  # whatever happens, the fork never returns into the server's loop
                code = _child(self.module.main, request, inherited)
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(code)
        self.running[pid] = say
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        say(n=request.get("n"), pid=pid)

    def reap(self):
        while self.running:
            try:
                pid, status, usage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            say = self.running.pop(pid, None)
            if say is not None:
                say(exit=pid, status=os.waitstatus_to_exitcode(status),
                    user_s=usage.ru_utime, system_s=usage.ru_stime)

    def stop_all(self, grace: float = 5.0):
        """Nothing started stays: TERM to every fork, KILL after ``grace`` s."""
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second one must not cut it short
        for pid in self.running:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        while self.running and time.monotonic() < deadline:
            self.reap()
            time.sleep(0.05)
        for pid in self.running:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def main(argv: list[str]) -> int:
    listen = None
    if argv[:1] == ["--listen"] and len(argv) == 3:
        listen, argv = argv[1], argv[2:]
    if len(argv) != 1:
        print("usage: python -m qaina_bench.harness.running.forkserver [--listen NAME] "
              "MODULE", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _stop)  # (``clean``): the forks are stopped too
    listener = None
    if listen is not None:  # bound before loading: requests wait in its backlog
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind("\0" + listen)
        listener.listen(1024)
    try:
        module = _load(argv[0])
    except _Stop:  # stopped while loading: nothing was started
        return 0
    server = ForkServer(module, listener)
    out = sys.stdout.buffer
    say = server.sayer(lambda b: (out.write(b), out.flush()))
    if listener is None:
        server.peers[0] = [b"", say, None]
    say(loaded=True)
    server.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
