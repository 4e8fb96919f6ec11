"""The run's directory on the servers of a cluster that do not share it with this
machine (each server has only its own disk).

A switch or agent on another server writes its log and records under the run's
directory at the same path on that server. For each such server the run keeps one
ssh session to ``remote follow`` (``harness/running/follow.py``), recorded like the
run's other processes: it makes the directory there (the run record lists it), writes
there the files the remote processes read (agent configurations, start signals:
``RunFiles.write``), and sends back every file that grows there into the same path
here while the run goes, so that what the harness reads during a run (agents'
records, a failed agent's log) is here as on one machine. At the end of a run, and
through ``qaina-bench clean`` after a ``kill -9``, the server's whole copy comes back
over ssh (``tar -c`` there, ``tar -x`` here) and is removed there. A server whose
copy fails costs one line (the run's errors and validity warnings); the rest of the
results are kept, and its copy is left where it is.

A trace set the remote agents replay is copied there before they start, into the
run's directory's ``.inputs/`` (``RunFiles.send_inputs``: one tar stream over ssh
per server, all at once), so a server needs no copy of its own; the followers and
the copy back skip ``.inputs/`` (the result set gets no traces), and it goes with the
rest of the directory there.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path

from .cluster import Server, run_remote
from .clustercheck import shared_directory
from .follow import INPUTS

PUT_TIMEOUT = 20.0  # seconds a server may take to write a file it is sent


class RemoteDirectory:
    """The run's directory on one server, followed over one ssh session into ``local``
    (by default the same path here)."""

    def __init__(self, server: Server, directory: Path, record=None, log: Path | None = None,
                 local: Path | None = None):
        self.server = server
        self.directory = Path(directory)
        self.local = Path(local or directory)
        self.record = record
        self.log = log
        self.made: str | None = None
        self.popen: subprocess.Popen | None = None
        self._acks: dict[int, threading.Event] = {}
        self._unsettled: list[tuple[int, threading.Event, str]] = []  # put, not waited
        self._next = 0
        self._lock = threading.Lock()
        self._reader: threading.Thread | None = None

    def open(self):
        """Start ``remote follow`` there; raises OSError (one line) if it does not answer."""
        if self.record is not None:  # listed before it is made
            self.record.add_remote_directory(self.server.name, self.server.user,
                                             str(self.directory), str(self.directory))
        err = open(self.log, "ab") if self.log else subprocess.DEVNULL
        cmd = self.server.ssh(sys.executable, "-m", "qaina_bench.harness.running.remote",
                              "follow", str(self.directory), lasting=True)
        self.popen = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=err, start_new_session=True)
        if self.log:
            err.close()
        first = self.popen.stdout.readline()
        said = first.decode(errors="replace").strip() or "no answer"
        try:
            info = json.loads(first)
            pid, started = int(info["pid"]), float(info["started"])
        except (ValueError, KeyError, TypeError):
            self.popen.kill()
            self.popen.wait()
            raise OSError(f"{self.server.name}: cannot keep the run's directory "
                          f"{self.directory} there: {said}"
                          + (f" (see {self.log})" if self.log else ""))
        self.made = info.get("made") or str(self.directory)
        if self.record is not None:
            self.record.add_process(self.popen.pid, f"ssh following the run's directory on "
                                    f"{self.server.name}")
            self.record.add_remote_process(self.server.name, self.server.user, pid, started,
                                           "run directory follower")
            self.record.add_remote_directory(self.server.name, self.server.user,
                                             str(self.directory), self.made)
        self._reader = threading.Thread(target=self._read, name=f"follow-{self.server.name}",
                                        daemon=True)
        self._reader.start()

    def _read(self):
        """Write what the server sends into the same path here; note its answers."""
        out = self.popen.stdout
        while True:
            line = out.readline()
            if not line:
                break
            try:
                msg = json.loads(line)
            except ValueError:
                break  # not the follower speaking: the session is of no more use
            if "ack" in msg:
                self._acks.pop(msg["ack"], threading.Event()).set()
                continue
            data = out.read(msg["size"]) if msg["size"] else b""
            self._store(msg["file"], msg["at"], data)
        for event in list(self._acks.values()):  # nobody will answer them now
            event.set()

    def _store(self, relative: str, at: int, data: bytes):
        path = (self.local / relative).resolve()
        if self.local.resolve() not in path.parents:
            return  # never outside the run's directory
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "r+b" if path.exists() else "wb") as f:
            if at == 0:
                f.truncate()
            f.seek(at)
            f.write(data)

    def put(self, relative: str, text: str, wait: bool = True):
        """Write ``text`` as the run directory's file ``relative`` there (whole), and
        wait until it is in place (``wait=False``: ``settle`` waits, for several)."""
        with self._lock:
            self._next += 1
            ident, event = self._next, threading.Event()
            self._acks[ident] = event
            self._unsettled.append((ident, event, relative))
            line = json.dumps({"id": ident, "file": relative, "data": text}) + "\n"
            try:
                self.popen.stdin.write(line.encode())
                self.popen.stdin.flush()
            except (OSError, ValueError):
                event.set()
        if wait:
            self.settle()

    def settle(self):
        """Wait until every file ``put`` sent is in place there; OSError (one line) for
        the first that is not."""
        with self._lock:
            unsettled, self._unsettled = self._unsettled, []
        deadline = time.monotonic() + PUT_TIMEOUT
        for ident, event, relative in unsettled:
            if not event.wait(max(0.0, deadline - time.monotonic())) or ident in self._acks \
                    or self.popen.poll() is not None:
                for other, _, _ in unsettled:
                    self._acks.pop(other, None)
                raise OSError(f"{self.server.name}: writing {relative} into the run's "
                              "directory there failed (its ssh session ended)")

    def close(self):
        """End the session (its reader has written all it was sent)."""
        if self.popen is None:
            return
        try:
            self.popen.stdin.close()
        except OSError:
            pass
        try:
            self.popen.wait(10)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()
        if self._reader is not None:
            self._reader.join(10)


def copy_back(server: Server, remote: str, local: Path, timeout: float = 300) -> str | None:
    """The server's directory ``remote`` copied into ``local`` here (tar over ssh);
    None, or why it was not."""
    local.mkdir(parents=True, exist_ok=True)
    try:
        src = subprocess.Popen(server.ssh("tar", "-C", remote, f"--exclude=./{INPUTS}",
                                          "-cf", "-", "."),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               start_new_session=True)
        dst = subprocess.run(["tar", "-x", "-C", str(local)], stdin=src.stdout,
                             capture_output=True, timeout=timeout)
        src.stdout.close()
        err = src.stderr.read().decode(errors="replace").strip()
        src.wait(timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{type(exc).__name__}: {exc}"
    if src.returncode != 0:
        return (err.splitlines() or [f"tar there exited with {src.returncode}"])[-1]
    if dst.returncode != 0:
        out = dst.stderr.decode(errors="replace").strip()
        return (out.splitlines() or [f"tar here exited with {dst.returncode}"])[-1]
    return None


def send_tree(source: Path, copies: list[tuple[Server, str]],
              timeout: float = 300) -> dict[str, str]:
    """Directory ``source`` copied into each (server, directory) of ``copies`` (the
    directory made if need be), one ``tar`` stream over ssh each, all at once; server
    name -> why its copy failed (empty: every copy is there)."""
    source = Path(source).resolve()
    started = []
    for server, dest in copies:
        there = f"mkdir -p {shlex.quote(dest)} && tar -x -C {shlex.quote(dest)}"
        try:
            src = subprocess.Popen(["tar", "-h", "-C", str(source.parent), "-cf", "-",
                                    source.name], stdout=subprocess.PIPE,
                                   stderr=subprocess.DEVNULL)
            dst = subprocess.Popen(server.ssh("sh", "-c", there), stdin=src.stdout,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   start_new_session=True)
            src.stdout.close()
            started.append((server, src, dst))
        except OSError as exc:
            return {server.name: str(exc)}
    problems = {}
    for server, src, dst in started:
        try:
            out = dst.communicate(timeout=timeout)[0].decode(errors="replace").strip()
            src.wait(timeout)
        except subprocess.TimeoutExpired:
            for popen in (src, dst):
                popen.kill()
                popen.wait()
            out = f"not done within {timeout:g} s"
        if dst.returncode or src.returncode:
            problems[server.name] = (out.splitlines() or [f"tar exited with "
                                                          f"{dst.returncode or src.returncode}"])[-1]
    return problems


def gather(server: Server, path: str, made: str, local: Path | None = None) -> str | None:
    """Copy the server's ``path`` back to ``local`` (by default the same path here),
    then remove it there with the parents the run made (up to ``made``); None, or
    one line saying what failed and what was left there."""
    problem = copy_back(server, path, Path(local or path))
    if problem is None:
        try:
            res = run_remote(server, ["rmtree", path, made])
            problem = None if res.returncode == 0 else (
                f"copied, but not removed there: {(res.stderr or res.stdout).strip()[-200:]}")
        except (OSError, subprocess.TimeoutExpired) as exc:
            problem = f"copied, but not removed there: {exc}"
        return None if problem is None else f"{server.name}: {path}: {problem}"
    return (f"{server.name}: its part of the run's directory was not copied back "
            f"({problem}); it stays there in {path}")


class RunFiles:
    """The run's directory across the servers of ``cluster`` (None: this machine only)."""

    def __init__(self, cluster, directory: Path, record=None, log_dir: Path | None = None):
        self.cluster = cluster
        self.directory = Path(directory)
        self.record = record
        self.log_dir = log_dir
        self.remote: list[RemoteDirectory] = []
        self.problems: list[str] = []

    def open(self):
        """Follow the run's directory on every server that does not see it as this
        machine does."""
        for server in self.cluster.remote if self.cluster is not None else []:
            if shared_directory(server, self.directory):
                continue  # a shared file system: nothing to carry
            log = self.log_dir / f"follow-{server.name}.log" if self.log_dir else None
            remote = RemoteDirectory(server, self.directory, self.record, log)
            self.remote.append(remote)
            remote.open()

    def write(self, path: Path, text: str = "", wait: bool = True):
        """Write the run directory's file ``path`` here (whole, by a rename) and on
        every server that follows the directory (``wait=False``: ``settle`` waits for
        it there, so that several files go at once)."""
        path = Path(path)
        tmp = path.with_name(f".{path.name}.partial")
        tmp.write_text(text)
        tmp.rename(path)
        relative = str(path.absolute().relative_to(self.directory.absolute()))
        for remote in self.remote:
            remote.put(relative, text, wait=False)
        if wait:
            self.settle()

    def send(self, path: Path, wait: bool = True):
        """The run directory's file ``path``, written here, to every following server."""
        if self.remote:
            self.write(path, Path(path).read_text(), wait)

    def settle(self):
        """Wait until what was written without waiting is in place on every server."""
        for remote in self.remote:
            remote.settle()

    def send_inputs(self, source: Path | None, servers, echo=None) -> dict[str, str]:
        """Directory ``source`` (a trace set) copied into ``.inputs/`` of the run's
        directory on every server of ``servers`` (names) that follows it; server name
        -> the copy's path there (a server not in it reads ``source`` itself). OSError
        (one line) when a copy fails."""
        targets = [r for r in self.remote if r.server.name in servers]
        if source is None or not targets:
            return {}
        dest = {r.server.name: str(r.directory / INPUTS) for r in targets}
        began = time.monotonic()
        problems = send_tree(Path(source), [(r.server, dest[r.server.name]) for r in targets])
        if problems:
            name, why = next(iter(problems.items()))
            raise OSError(f"{name}: copying {source} into {dest[name]} there failed: {why}")
        if echo is not None:
            size = sum(f.stat().st_size for f in Path(source).resolve().rglob("*")
                       if f.is_file())
            echo(f"  trace set {source} ({size / 1e6:.1f} MB) copied to "
                 f"{', '.join(r.server.name for r in targets)} in "
                 f"{time.monotonic() - began:.2f} s")
        return {name: f"{d}/{Path(source).resolve().name}" for name, d in dest.items()}

    def close(self):
        """End the following sessions (what grows there now comes back with ``gather``)."""
        for remote in self.remote:
            remote.close()

    def gather(self) -> list[str]:
        """Every server's copy back here and removed there; one line per failure."""
        self.close()
        for remote in self.remote:
            if self.record is not None and str(remote.directory) not in [
                    d["path"] for d in self.record.remote_directories(remote.server.name)]:
                continue  # the record's removal has copied it back already
            problem = gather(remote.server, str(remote.directory), remote.made, remote.local)
            if problem is None and self.record is not None:
                self.record.drop_remote_directory(remote.server.name, str(remote.directory))
            elif problem is not None:
                self.problems.append(problem)
        if self.record is not None and self.remote:
            self.record.save()
        self.remote = []
        return self.problems
