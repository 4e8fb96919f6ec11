"""What a run starts on its hosts, and the signals it holds while it starts them.

``AgentProcess`` is one launched agent and the records it has written so far;
``deferred_signals`` holds Ctrl-C and SIGTERM (and SIGHUP, a closed terminal, unless
the run was started with it ignored, as by ``nohup``) until a block that starts or records
processes is done (``ignored_signals`` drops them during the teardown), so that
nothing started is ever left unrecorded; ``nudged`` makes sure a signal's handler runs
while the main thread waits in a system call (the CLI's next line).
"""

from __future__ import annotations

import errno
import json
import os
import select
import signal
import stat
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from ...hosts.agent import AgentConfig


@dataclass
class AgentProcess:
    job: int
    worker: int
    host: str
    config: AgentConfig
    popen: object
    log: Path
    _records: list = field(default_factory=list)
    _offset: int = 0  # bytes of the agent's record file read so far

    def records(self) -> list[dict]:
        """The agent's records so far; each call reads only what was added since."""
        try:
            with open(self.config.output, "rb") as f:
                f.seek(self._offset)
                new = f.read()
        except OSError:
            return self._records
        end = new.rfind(b"\n") + 1  # a line being written waits for the next call
        for line in new[:end].splitlines():
            try:
                self._records.append(json.loads(line))
            except ValueError:
                pass
        self._offset += end
        return self._records

    def iterations_done(self) -> int:
        return sum(1 for r in self.records() if r.get("type") == "iteration")


def _terminate(signum, frame):
    """SIGTERM (and SIGHUP) ends a run like Ctrl-C: torn down, results kept."""
    if signum == signal.SIGHUP:
        detach_terminal()
    raise KeyboardInterrupt


def end_on_termination():
    """SIGTERM, and SIGHUP unless it is ignored, end the run from now on as Ctrl-C does."""
    signal.signal(signal.SIGTERM, _terminate)
    if hangup_handled():
        signal.signal(signal.SIGHUP, _terminate)


def hangup_handled() -> bool:
    """Whether SIGHUP ends a run: not where it was started with SIGHUP ignored
    (``nohup``), which must keep it going when the terminal closes."""
    return signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN


def terminal_echo(echo):
    """``echo`` that outlives its terminal: a write that fails because the terminal
    closed (EIO; SIGHUP comes after it) or the reader of a pipe left (EPIPE) is
    dropped, and later lines to a terminal go to /dev/null (``detach_terminal``); the
    run goes on to its teardown and results."""
    def lasting(*args, **kwargs):
        try:
            echo(*args, **kwargs)
        except OSError as exc:
            if exc.errno not in (errno.EIO, errno.EPIPE, errno.ENXIO):
                raise
            detach_terminal()
    return lasting


def detach_terminal():
    """The terminal hung up: standard output and error that went to it go to
    /dev/null from now on, so that the teardown's lines cannot fail it (EIO).
    Files and pipes keep them."""
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        for fd in (1, 2):
            try:
                if stat.S_ISCHR(os.fstat(fd).st_mode):
                    os.dup2(null, fd)
            except OSError:
                pass
    finally:
        os.close(null)


class RunError(RuntimeError):
    """The run could not be carried out; the message names the part that failed."""


class deferred_signals:
    """Ctrl-C and SIGTERM wait until the block is done, then interrupt: Mininet and
    the bookkeeping of a started process must not be cut in the middle."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    #: the last signal any block held: one that came in a block that ended with an
    #: error, or while a run was torn down, is not lost (``Run.signalled``)
    held_last: int | None = None

    def __enter__(self):
        self.caught = None
        signums = [s for s in self.SIGNALS if s != signal.SIGHUP or hangup_handled()]
        self.previous = {s: signal.signal(s, self._note) for s in signums}
        return self

    def _note(self, signum, frame):
        self.caught = deferred_signals.held_last = signum
        if signum == signal.SIGHUP:
            detach_terminal()

    def __exit__(self, kind, value, tb):
        for s, handler in self.previous.items():
            signal.signal(s, handler)
        if self.caught is not None and kind is None:
            raise KeyboardInterrupt


class ignored_signals(deferred_signals):
    """Ctrl-C and SIGTERM are ignored in the block (teardown runs to its end)."""

    def __exit__(self, kind, value, tb):
        for s, handler in self.previous.items():
            signal.signal(s, handler)


class nudged:
    """In the block, each of ``signums`` that comes is handled within a tenth of a
    second, even while the main thread waits in a system call.

    Python runs a signal's handler in the main thread, between two of its steps. A
    signal that another thread (gRPC's) received, or that came just before the main
    thread began a blocking call (the CLI's read of its next line, right after the
    prompt), interrupts nothing: its handler would wait for the call to return. Each
    signal's arrival is written to a pipe (``signal.set_wakeup_fd``); a watching thread
    then sends the main thread SIGURG (handled, doing nothing) every 0.1 s until the
    signal's handler has run (for at most ``PATIENCE`` seconds): each SIGURG interrupts
    the call, and Python runs the pending handler before it resumes the call."""

    NUDGE = signal.SIGURG
    PATIENCE = 5.0

    def __init__(self, *signums: int):
        self.signums = set(signums)

    def __enter__(self):
        self.owed = 0  # signals come, less handlers run
        self.lock = threading.Lock()
        self.previous = {s: signal.getsignal(s) for s in self.signums}
        for s, handler in self.previous.items():
            if callable(handler):  # a Python handler: the only kind Python wakes for
                signal.signal(s, self._counted(handler))
        self.read_end, self.write_end = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.ended = threading.Event()
        self.main = threading.main_thread().ident
        self.previous_nudge = signal.signal(self.NUDGE, lambda signum, frame: None)
        self.previous_fd = signal.set_wakeup_fd(self.write_end, warn_on_full_buffer=False)
        self.watcher = threading.Thread(target=self._watch, name="nudge", daemon=True)
        self.watcher.start()
        return self

    def _counted(self, handler):
        def run(signum, frame):
            with self.lock:
                self.owed -= 1
            return handler(signum, frame)
        return run

    def _watch(self):
        while not self.ended.is_set():
            ready, _, _ = select.select([self.read_end], [], [], 0.5)
            try:
                came = os.read(self.read_end, 512) if ready else b""
            except BlockingIOError:
                came = b""
            with self.lock:
                self.owed += sum(1 for signum in came if signum in self.signums)
            give_up = time.monotonic() + self.PATIENCE
            while self.owed > 0 and time.monotonic() < give_up and not self.ended.wait(0.1):
                signal.pthread_kill(self.main, self.NUDGE)
            with self.lock:
                self.owed = min(self.owed, 0)  # signals that came at once run one handler

    def __exit__(self, kind, value, tb):
        self.ended.set()
        self.watcher.join()
        signal.set_wakeup_fd(self.previous_fd)
        signal.signal(self.NUDGE, self.previous_nudge)
        for s, handler in self.previous.items():
            signal.signal(s, handler)
        os.close(self.read_end)
        os.close(self.write_end)


def agent_env() -> dict:
    """Agents run single-threaded numpy: many share two cores with the switches, and
    GradiVeQ needs every worker's basis fit to give identical results."""
    env = dict(os.environ)
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = "1"
    return env


def how_ended(code: int) -> str:
    """How a process ended, from its return code: ``exited with 1``, or ``was killed
    by SIGKILL`` for a negative one."""
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with {code}"


def failed_text(what: str, code: int, log: Path) -> str:
    """One line for a process that failed: how it ended and the end of its log."""
    tail = log.read_text(errors="replace").strip().splitlines()[-3:]
    return f"{what} {how_ended(code)}: {' | '.join(tail) or 'its log is empty'} (log {log})"


def unfinished(agents: list[AgentProcess], ledger, testbed, starter=None) -> str:
    """The agents that have not ended, for the line of a run past its timeout: each
    with the iterations it logged, and "stopped by a signal" for one stopped on this
    machine (an agent on another server of a cluster is not looked at); if the agents'
    starter is stopped, their ends are said to be unknown instead."""
    from ..switches.targets import stopped

    def stopped_here(a) -> bool:
        return (getattr(testbed.host(a.host), "server_key", None) is None
                and stopped(a.popen.pid))

    out = [f"j{a.job}w{a.worker} on {a.host} ({a.iterations_done()} iterations"
           + (", stopped by a signal)" if stopped_here(a) else ")")
           for a in agents if ledger.poll(a.popen) is None]
    down = links_down(testbed)
    lost = starter.stopped_pid() if starter is not None else None
    head = (f"; the agent starter (pid {lost}) is stopped by a signal, so how these "
            "ended is not known: " if lost else "; still running: ")
    return ((head + ", ".join(out) if out else "")
            + (f"; links not up: {', '.join(down)}" if down else ""))


def named_cause(exc: Exception, testbed, starter) -> Exception:
    """What a run that failed with ``exc`` names as its cause: a switch that died, or
    the agents' starter, before the error they caused; a RunError (an agent that
    failed) with the links that are not up added."""
    death = (testbed and testbed.switch_death()) or (starter and starter.death())
    if death:
        return death
    down = links_down(testbed) if testbed is not None and testbed.net is not None else []
    if down and isinstance(exc, RunError):
        return RunError(f"{exc}; links not up: {', '.join(down)}")
    return exc


def links_down(testbed) -> list[str]:
    """The links of this machine's switches whose switch end is not up (taken down at
    either end, or removed): ``s1-eth2 to h2 (down)`` each."""
    return [f"{link} ({state})" for link, state in link_states_down(testbed)]


def link_states_down(testbed) -> list[tuple[str, str]]:
    """(``s1-eth2 to h2``, its state) for each link of ``links_down``."""
    here = {intf.name for sw in testbed.net.switches if getattr(sw, "server_key", None) is None
            for intf in sw.intfList() if intf.name != "lo"}
    out = []
    for name, peer in sorted(testbed.interface_peers().items()):
        if name not in here:
            continue
        try:
            state = Path(f"/sys/class/net/{name}/operstate").read_text().strip()
        except OSError:
            state = "removed"
        if state not in ("up", "unknown"):  # (unknown: a device that has no carrier)
            out.append((f"{name} to {peer}", state))
    return out


class LinkWatch:
    """Says at once when a link of this machine's switches goes down, or comes back,
    while the jobs run (their agents wait for it, and give up after their
    ``stall_timeout`` without a result), and keeps each outage for the summary: ``outages``, each a link with the
    seconds after ``t0`` it went down and came back (None: not before the jobs
    ended)."""

    def __init__(self, testbed, t0: float, say, every: float = 1.0):
        self.testbed, self.t0, self.say, self.every = testbed, t0, say, every
        self.outages: list[dict] = []
        self.at = float("-inf")

    def check(self, now: float):
        """Look at the links if ``every`` seconds have passed since the last look."""
        if now - self.at < self.every or self.testbed is None or self.testbed.net is None:
            return
        self.at = now
        down = dict(link_states_down(self.testbed))
        open_ = {o["link"]: o for o in self.outages if o["up_s"] is None}
        for link, state in down.items():
            if link not in open_:
                self.outages.append({"link": link, "state": state,
                                     "down_s": round(now - self.t0, 1), "up_s": None})
                self.say(f"  link {link} is {state} ({now - self.t0:.1f} s): the jobs that "
                         "cross it wait for it; their agents give up after "
                         f"{AgentConfig.stall_timeout:.0f} s without a result")
        for link, outage in open_.items():
            if link not in down:
                outage["up_s"] = round(now - self.t0, 1)
                self.say(f"  link {link} is up again ({now - self.t0:.1f} s, "
                         f"{outage['up_s'] - outage['down_s']:.1f} s after it went "
                         f"{outage['state']})")


def end_popens(popens: list):
    """SIGTERM to each of ``popens`` still running, SIGKILL to one not ended 5 s later."""
    for popen in popens:
        if popen.poll() is None:
            popen.terminate()
    for popen in popens:
        try:
            popen.wait(5)
        except Exception:
            popen.kill()
