"""Agents started by forking one process that has already loaded them.

An agent process spends most of its start importing numpy and numba and loading its
compiled kernels (about 0.7 s of CPU each): a run of 16 agents on 2 cores waited
seconds for that alone. ``AgentStarter`` starts one *starter* process per run
(``python -m qaina_bench.harness.running.starter``) that imports a host program's
module once and loads the kernels; each agent is then a fork of it that enters its
Mininet host's network namespace (``setns``) and calls the module's ``main(argv)``.
Nothing it computes is shared between agents or runs: each fork starts from the
starter's state, as a fresh process would from the disk cache.

The starter speaks JSON lines: on its standard input a request per process to start,
on its standard output the PID of each fork, then its exit status and CPU times (from
``wait4``, so that a run's CPU ledger gets an agent's final times although the
harness is not its parent). ``Forked`` is the harness's handle of one fork, with
``subprocess.Popen``'s ``pid``, ``poll``, ``wait``, ``send_signal``, ``terminate`` and
``kill``; signals go through a pidfd, so a PID the kernel reused is never signalled.
When the harness goes (its end of the pipe closes), the starter stops what it
started and exits.
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

CLONE_NEWNS = 0x00020000
CLONE_NEWNET = 0x40000000


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
            [sys.executable, "-m", __name__, module], env=env, stdin=subprocess.PIPE,
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

    def arguments(self, cmd: list[str]) -> list[str] | None:
        """The arguments of ``cmd`` if it runs the starter's module in this Python
        (``python -m MODULE ARGS...``), else None."""
        if cmd[:3] == [sys.executable, "-m", self.module]:
            return cmd[3:]
        return None

    def wait_loaded(self, timeout: float = 300.0):
        """Until the starter has loaded its module (compiling the kernels where the
        disk cache lacks them can take a while on a busy machine)."""
        with self._news:
            self._await(lambda: self.loaded, timeout, f"load {self.module}")

    def start(self, argv: list[str], namespace_pid: int, log: Path,
              timeout: float = 60.0) -> Forked:
        """Fork a process that runs ``main(argv)`` of the starter's module in the
        namespaces of process ``namespace_pid`` (a Mininet host's shell), its output
        appended to ``log``; returns its handle once its PID is known."""
        self._requests += 1
        number = self._requests
        request = {"n": number, "argv": argv, "ns_pid": namespace_pid, "log": str(log)}
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

    def exit_of(self, pid: int) -> tuple | None:
        """(exit status, (user, system) CPU seconds) of a fork that ended, else None;
        a fork the starter lost (it exited first) counts as killed."""
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


# -- the starter process -----------------------------------------------------------------

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


def _child(main, request: dict, inherited: set[int]) -> int:
    """In the fork: the namespace, the output, then ``main``; returns its status."""
    os.setsid()
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    for fd in inherited | {log, null}:
        os.close(fd)
    try:
        _enter(request["ns_pid"])
        return main(request["argv"]) or 0
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1
    except BaseException as exc:  # noqa: BLE001 - the fork must never return
        print(f"agent starter: {type(exc).__name__}: {exc}", file=sys.stderr)
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


def serve(module_name: str):
    """Load ``module_name`` (and the agents' kernels), then start a fork per request
    until standard input closes; report each fork's PID and its end."""
    module = _load(module_name)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w)
    out = sys.stdout.buffer
    running: set[int] = set()
    pending = b""

    def say(**news):
        try:
            out.write(json.dumps(news).encode() + b"\n")
            out.flush()
        except OSError:  # the harness is gone (killed): its forks are stopped below
            pass

    def reap():
        while running:
            try:
                pid, status, usage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            running.discard(pid)
            say(exit=pid, status=os.waitstatus_to_exitcode(status),
                user_s=usage.ru_utime, system_s=usage.ru_stime)

    say(loaded=True)
    while True:
        ready, _, _ = select.select([0, wake_r], [], [])
        if wake_r in ready:
            os.read(wake_r, 512)
            reap()
        if 0 not in ready:
            continue
        data = os.read(0, 65536)
        if not data:
            break
        pending += data
        *lines, pending = pending.split(b"\n")
        for line in lines:
            request = json.loads(line)
            sys.stdout.flush()
            try:
                pid = os.fork()
            except OSError as exc:
                say(n=request["n"], error=str(exc))
                continue
            if pid == 0:
                code = _child(module.main, request, {wake_r, wake_w})
                try:
                    sys.stdout.flush()
                    sys.stderr.flush()
                finally:
                    os._exit(code)
            running.add(pid)
            say(n=request["n"], pid=pid)
    for pid in running:  # the harness went: nothing it started stays
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 5
    while running and time.monotonic() < deadline:
        reap()
        time.sleep(0.05)
    for pid in running:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


if __name__ == "__main__":
    serve(sys.argv[1])
