"""What a run started, written down so that it, and only it, can be removed.

A run keeps ``/run/qaina-bench/<run-id>.json`` up to date with the PIDs it started
(each with its start time, so a reused PID is never mistaken for ours), both ends of
every link it created, the ports its switches listen on, the nftables tables it
added (each with its family: ``netdev`` loss tables, ``inet`` tables that keep
BMv2's Thrift ports for loopback) and the cgroups of CPU-limited hosts. ``qaina-bench clean``, and the next
``up``, read the records of runs whose owner process is gone and remove exactly what
they list.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import psutil

from ..results.resultset import read_text
from ..switches.firewall import delete_table, table_exists

#: the most a record file may hold: a run's record is kilobytes, so anything larger (or
#: a pipe or device in its place, which would never end a read) is no record of ours
MAX_RECORD = 16 << 20


def record_dir() -> Path:
    """Where run records live: ``$QAINA_RECORD_DIR``, by default /run/qaina-bench."""
    return Path(os.environ.get("QAINA_RECORD_DIR", "/run/qaina-bench"))



def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _time(v) -> bool:
    """Whether ``v`` is a start time as a run records it: a finite number of seconds."""
    try:
        return _number(v) and math.isfinite(float(v))
    except OverflowError:  # an integer beyond any float
        return False


def _pid(v) -> bool:
    """Whether ``v`` is a process id (a positive integer; not a bool)."""
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


#: what each list of a record (or of its part for a server) holds: a check per item
_ITEMS = {
    "processes": lambda p: isinstance(p, dict) and _pid(p.get("pid"))
    and isinstance(p.get("what"), str) and (p.get("started") is None or _time(p["started"])),
    "interfaces": lambda n: isinstance(n, str),
    "nft_tables": lambda t: isinstance(t, dict) and isinstance(t.get("family"), str)
    and isinstance(t.get("name"), str),
    "cgroups": lambda c: isinstance(c, str),
    "temp_directories": lambda d: isinstance(d, str),
    "held_to_the_end": lambda x: isinstance(x, str),
    "ports": lambda p: isinstance(p, dict) and isinstance(p.get("port"), int),
    "directories": lambda d: isinstance(d, dict) and isinstance(d.get("path"), str)
    and isinstance(d.get("made"), str),
}


def part_problem(part) -> str | None:
    """Why ``part`` (a record's lists: its own, or those of one server) is not one, in
    one line; None when it is."""
    if not isinstance(part, dict):
        return "not a JSON object"
    for key, fits in _ITEMS.items():
        items = part.get(key, [])
        if not isinstance(items, list):
            return f"{key} is not a list"
        if not all(fits(item) for item in items):
            return f"{key} holds an entry of the wrong shape"
    return None


def record_problem(data) -> str | None:
    """Why ``data`` is not a run record, in one line; None when it is one."""
    problem = part_problem(data)
    if problem:
        return problem
    if not isinstance(data.get("run_id"), str) or not _pid(data.get("owner")):
        return "no run_id or owner"
    if data.get("owner_started") is not None and not _time(data["owner_started"]):
        return "owner_started is no start time"
    if not isinstance(data.get("processes"), list) or not isinstance(data.get("interfaces"), list):
        return "no processes or interfaces"
    switches = data.get("switches", {})
    if not isinstance(switches, dict) or not all(
            isinstance(sw, dict) and isinstance(sw.get("grpc_addr"), str)
            and isinstance(sw.get("device_id"), int) for sw in switches.values()):
        return "switches of the wrong shape"
    servers = data.get("servers", {})
    if not isinstance(servers, dict):
        return "servers is not a JSON object"
    for name, part in servers.items():
        problem = part_problem(part)
        if problem:
            return f"server {name}: {problem}"
    return None


class RunRecord:
    def __init__(self, run_id: str, directory: Path | None = None):
        self.run_id = run_id
        self.path = Path(directory or record_dir()) / f"{run_id}.json"
        self.data = {"run_id": run_id, "owner": os.getpid(),
                     "owner_started": _start_time(os.getpid()), "processes": [],
                     "interfaces": [], "nft_tables": [], "ports": [], "cgroups": [],
                     "created": time.time()}

    @classmethod
    def load(cls, path: Path) -> "RunRecord":
        """The record in ``path``; ValueError if it is none (not a regular file, larger
        than ``MAX_RECORD``, not a record's JSON), OSError if it cannot be read."""
        rec = cls.__new__(cls)
        rec.path = Path(path)
        rec.data = _record_data(rec.path)
        problem = record_problem(rec.data)
        if problem:
            raise ValueError(f"{path}: not a run record ({problem})")
        rec.run_id = rec.data["run_id"]
        return rec

    def save(self):
        """Write the record whole or not at all (a half-written one is never left)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(json.dumps(self.data, indent=1))
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def add_process(self, pid: int | None, what: str, last: bool = False):
        """``last``: the run holds it to its very end, after the check of what its
        teardown left (``leftovers(but_last=True)``; ``held_to_the_end``)."""
        if pid is None:
            return
        self.data["processes"].append({"pid": pid, "what": what, "started": _start_time(pid)})
        if last:
            self._hold_to_the_end(f"process {what} ({pid})")
        self.save()

    def _hold_to_the_end(self, leftover: str):
        """What ``leftovers`` would say of a thing the run holds to its very end."""
        self.data.setdefault("held_to_the_end", []).append(leftover)

    def add_port(self, port: int, what: str):
        self.data["ports"].append({"port": port, "what": what})

    def add_switch(self, name: str, grpc_addr: str, device_id: int, target: str):
        """Where a switch of the run answers P4Runtime (``qaina-bench shell`` reads it)."""
        self.data.setdefault("switches", {})[name] = {
            "grpc_addr": grpc_addr, "device_id": device_id, "target": target}

    def _server(self, server: str, user: str) -> dict:
        """The record's part for a server of a cluster (``--cluster``)."""
        servers = self.data.setdefault("servers", {})
        return servers.setdefault(server, {"user": user, "processes": [], "interfaces": []})

    def add_remote_process(self, server: str, user: str, pid: int, started: float | None,
                           what: str):
        """A process the run started on another server of its cluster."""
        self._server(server, user)["processes"].append(
            {"pid": pid, "what": what, "started": started})
        self.save()

    def add_remote_interface(self, server: str, user: str, name: str):
        listed = self._server(server, user)["interfaces"]
        if name not in listed:
            listed.append(name)

    def add_remote_directory(self, server: str, user: str, path: str, made: str):
        """The run's directory on a server that does not share it (``rundir.py``), and
        the topmost directory the run made for it there."""
        listed = self._server(server, user).setdefault("directories", [])
        listed[:] = [d for d in listed if d["path"] != path] + [{"path": path, "made": made}]
        self.save()

    def remote_directories(self, server: str) -> list[dict]:
        return self.data.get("servers", {}).get(server, {}).get("directories", [])

    def drop_remote_directory(self, server: str, path: str):
        part = self.data.get("servers", {}).get(server, {})
        part["directories"] = [d for d in part.get("directories", []) if d["path"] != path]

    def add_remote_cgroups(self, server: str, user: str, paths: list[str]):
        """Cgroup directories the run makes on another server (``--host-cpu``)."""
        listed = self._server(server, user).setdefault("cgroups", [])
        listed += [p for p in paths if p not in listed]

    def add_remote_nft_table(self, server: str, user: str, family: str, name: str):
        """An nftables table the run adds on another server (listed before it is made,
        e.g. the guard of a remote BMv2's Thrift port)."""
        listed = self._server(server, user).setdefault("nft_tables", [])
        entry = {"family": family, "name": name}
        if entry not in listed:
            listed.append(entry)
        self.save()

    def _on_servers(self, action: str) -> list[str]:
        """``remove`` or ``leftovers`` of what the record lists on other servers; on
        removal, the run's directory there is copied back here first."""
        out = []
        if self.data.get("servers"):
            from .cluster import Server, remote_resources
            from .rundir import gather
            for name, part in self.data["servers"].items():
                server = Server(name, part.get("user", "root"))
                out += remote_resources(server, action, part)
                for d in part.get("directories", []) if action == "remove" else []:
                    problem = gather(server, d["path"], d["made"])
                    out.append(problem or f"{name}: copied {d['path']} back and removed it")
                    if problem is None:
                        self.drop_remote_directory(name, d["path"])
        return out

    def add_interface(self, name: str):
        if name not in self.data["interfaces"]:
            self.data["interfaces"].append(name)

    def add_temp_directory(self, path: Path | str, last: bool = False):
        """A temporary directory the run made (removed with everything in it);
        ``last`` as for ``add_process``."""
        listed = self.data.setdefault("temp_directories", [])
        if str(path) not in listed:
            listed.append(str(path))
        if last:
            self._hold_to_the_end(f"temporary directory {path}")

    def add_nft_table(self, family: str, name: str):
        """An nftables table the run adds (listed before it is made)."""
        entry = {"family": family, "name": name}
        if entry not in self.nft_tables():
            self.data.setdefault("nft_tables", []).append(entry)

    def nft_tables(self) -> list[dict]:
        """The run's nftables tables as ``{"family", "name"}`` (a bare name, as older
        records hold, is a netdev table)."""
        return [t if isinstance(t, dict) else {"family": "netdev", "name": t}
                for t in self.data.get("nft_tables", [])]

    def add_cgroups(self, paths: list[str]):
        listed = self.data.setdefault("cgroups", [])
        for path in paths:
            if path not in listed:
                listed.append(path)

    def owner_alive(self) -> bool:
        """Whether the process that made the record still runs (its PID with the start
        time recorded with it: a record without one has no live owner)."""
        return _same_process(self.data["owner"], self.data.get("owner_started"))

    def remove(self) -> list[str]:
        """Remove everything listed that still exists, and the record; returns what
        was done."""
        done = self.remove_resources()
        self.path.unlink(missing_ok=True)
        return done

    def remove_resources(self) -> list[str]:
        """Stop the listed processes that are still ours, delete the listed interfaces,
        nftables tables and cgroups that still exist; returns what was done."""
        done = self._stop_processes()
        for name in self.data["interfaces"]:
            if _interface_exists(name):
                subprocess.run(["ip", "link", "del", name], capture_output=True)
                done.append(f"deleted interface {name}")
        for table in self.nft_tables():
            if delete_table(table["family"], table["name"]):
                done.append(f"deleted nftables table {table['family']} {table['name']}")
        for path in self.data.get("cgroups", []):
            try:
                Path(path).rmdir()  # a cgroup directory goes once its tasks are gone
                done.append(f"deleted cgroup {path}")
            except OSError:
                pass
        for path in self.data.get("temp_directories", []):
            if Path(path).is_dir():
                shutil.rmtree(path, ignore_errors=True)
                done.append(f"deleted temporary directory {path}")
        return done + self._on_servers("remove")

    def _stop_processes(self) -> list[str]:
        """Stop the listed processes that are still ours (their PID with the start time
        recorded with it); returns what was done, and which PIDs recorded without a
        start time were left although some process holds them now."""
        procs = [(p, proc) for proc in self.data["processes"]
                 if (p := _our_process(proc["pid"], proc.get("started"))) is not None]
        stopped = {p.pid for p in stop_processes([p for p, _ in procs])}
        done = [f"stopped {proc['what']} (pid {proc['pid']})" for p, proc in procs
                if p.pid in stopped]
        return done + [f"not stopped {p['what']} (pid {p['pid']}): no start time recorded"
                       for p in self.data["processes"]
                       if p.get("started") is None and _pid(p["pid"])
                       and psutil.pid_exists(p["pid"])]

    def leftovers(self, wait: float = 2.0, but_last: bool = False) -> list[str]:
        """What the record lists that still exists (after up to ``wait`` seconds for
        the kernel to finish removing namespaces); ``but_last``: not what the run
        holds to its very end (``add_process(last=True)``)."""
        deadline = time.monotonic() + wait
        held = set(self.data.get("held_to_the_end", [])) if but_last else set()
        while True:
            left = [f"process {p['what']} ({p['pid']})" for p in self.data["processes"]
                    if _same_process(p["pid"], p.get("started"))]
            left += [f"interface {n}" for n in self.data["interfaces"] if _interface_exists(n)]
            left += [f"cgroup {c}" for c in self.data.get("cgroups", []) if Path(c).is_dir()]
            left += [f"temporary directory {d}" for d in self.data.get("temp_directories", [])
                     if Path(d).is_dir()]
            left += [f"nftables table {t['family']} {t['name']}" for t in self.nft_tables()
                     if table_exists(t["family"], t["name"])]
            left = [x for x in left if x not in held]
            if not left or time.monotonic() > deadline:
                return left + self._on_servers("leftovers")
            time.sleep(0.1)

    def close(self):
        """The run ended cleanly: forget the record."""
        self.path.unlink(missing_ok=True)


def _record_data(path: Path):
    """The JSON of the record file ``path``, read only if it is a regular file of at
    most ``MAX_RECORD`` bytes; ValueError otherwise, or if it is no JSON."""
    try:
        text = read_text(path, MAX_RECORD)
    except ValueError as exc:  # a pipe, a device, a directory, too large, not UTF-8
        raise ValueError(f"{path}: {exc}") from None
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError(f"{path}: nested too deeply for a run record") from None


def _start_time(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None



def stop_processes(procs: list, grace: float = 3.0) -> list:
    """SIGTERM to each of ``procs`` (psutil processes), SIGKILL to those still running
    ``grace`` seconds later; returns the ones that were signalled."""
    signalled = []
    for p in procs:
        try:
            p.send_signal(signal.SIGTERM)
            signalled.append(p)
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(signalled, timeout=grace)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=grace)
    return signalled


def _same_process(pid: int, started: float | None) -> bool:
    """Whether ``pid`` is still the process that started at ``started`` (``_our_process``)."""
    return _our_process(pid, started) is not None


def _our_process(pid: int, started: float | None) -> psutil.Process | None:
    """The live process ``pid`` if it started at ``started``; None if it is gone, or if
    the PID is another's now: one the kernel gave to another process since, or one
    recorded without a (finite) start time, which alone may be anyone's."""
    if not _pid(pid) or not _time(started):
        return None
    try:
        p = psutil.Process(pid)
        if abs(p.create_time() - started) > 0.05 or p.status() == psutil.STATUS_ZOMBIE:
            return None
        return p
    except psutil.Error:
        return None


def _interface_exists(name: str) -> bool:
    """Whether ``name`` exists in this (the root) network namespace."""
    return Path(f"/sys/class/net/{name}").exists()


def leftover_temp_files(directory: Path | None = None) -> list[Path]:
    """Half-written records of runs that died while saving."""
    return [p for p in Path(directory or record_dir()).glob(".*.json.*") if p.is_file()]


def _loaded(directory: Path | None):
    """``(path, record, None)`` for every ``*.json`` of the record directory, or
    ``(path, None, why)`` where it is no readable run record."""
    for path in sorted(Path(directory or record_dir()).glob("*.json")):
        try:
            yield path, RunRecord.load(path), None
        except (OSError, ValueError, KeyError) as exc:
            if isinstance(exc, FileNotFoundError) and not os.path.lexists(path):
                continue  # closed by its run since it was listed
            yield path, None, str(exc) or type(exc).__name__


def _records(directory: Path | None):
    # what is no record of ours (another tool's, a damaged one) is passed over here
    return (rec for _, rec, _ in _loaded(directory) if rec is not None)


def unreadable_records(directory: Path | None = None) -> list[tuple[Path, str]]:
    """``*.json`` files of the record directory that are no readable run record (a
    damaged one, another tool's), with why: ``clean`` names them and leaves them."""
    return [(path, why) for path, rec, why in _loaded(directory) if rec is None]


def stale_records(directory: Path | None = None) -> list[RunRecord]:
    """Records of runs whose owner process is no longer alive."""
    return [rec for rec in _records(directory) if not rec.owner_alive()]


def live_records(directory: Path | None = None) -> list[RunRecord]:
    """Records of runs still going (their owner process is alive)."""
    return [rec for rec in _records(directory) if rec.owner_alive()]
