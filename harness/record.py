"""What a run started, written down so that it, and only it, can be removed.

A run keeps ``/run/qaina-bench/<run-id>.json`` up to date with the PIDs it started
(each with the command line it had, so a reused PID is never mistaken for ours), the
interfaces it created and the nftables tables it added. ``qaina-bench clean`` reads the records
of runs whose owner process is gone and removes exactly what they list.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import psutil

RECORD_DIR = Path(os.environ.get("QAINA_RECORD_DIR", "/run/qaina-bench"))


class RunRecord:
    def __init__(self, run_id: str, directory: Path = RECORD_DIR):
        self.run_id = run_id
        self.path = Path(directory) / f"{run_id}.json"
        self.data = {"run_id": run_id, "owner": os.getpid(), "processes": [],
                     "interfaces": [], "nft_tables": [], "created": time.time()}

    @classmethod
    def load(cls, path: Path) -> "RunRecord":
        rec = cls.__new__(cls)
        rec.path = Path(path)
        rec.data = json.loads(rec.path.read_text())
        rec.run_id = rec.data["run_id"]
        return rec

    def save(self):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1))
        tmp.replace(self.path)

    def add_process(self, pid: int | None, what: str):
        if pid is None:
            return
        try:
            cmdline = psutil.Process(pid).cmdline()
        except psutil.Error:
            cmdline = []
        self.data["processes"].append({"pid": pid, "what": what, "cmdline": cmdline})
        self.save()

    def add_interface(self, name: str):
        if name not in self.data["interfaces"]:
            self.data["interfaces"].append(name)

    def owner_alive(self) -> bool:
        """Whether the process that made the record still runs."""
        try:
            return psutil.Process(self.data["owner"]).is_running()
        except psutil.Error:
            return False

    def remove(self) -> list[str]:
        """Remove everything listed that still exists; returns what was done."""
        done = []
        for proc in self.data["processes"]:
            try:
                p = psutil.Process(proc["pid"])
                if proc["cmdline"] and p.cmdline() != proc["cmdline"]:
                    continue  # the PID now belongs to something else
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(3)
                except psutil.TimeoutExpired:
                    p.kill()
                done.append(f"stopped {proc['what']} (pid {proc['pid']})")
            except psutil.Error:
                pass
        for name in self.data["interfaces"]:
            if Path(f"/sys/class/net/{name}").exists():
                subprocess.run(["ip", "link", "del", name], capture_output=True)
                done.append(f"deleted interface {name}")
        for table in self.data.get("nft_tables", []):
            res = subprocess.run(["nft", "delete", "table", "netdev", table],
                                 capture_output=True)
            if res.returncode == 0:
                done.append(f"deleted nftables table {table}")
        self.path.unlink(missing_ok=True)
        return done

    def close(self):
        """The run ended cleanly: forget the record."""
        self.path.unlink(missing_ok=True)


def _records(directory: Path):
    for path in sorted(Path(directory).glob("*.json")):
        try:
            yield RunRecord.load(path)
        except (OSError, ValueError, KeyError):
            continue  # not a record of ours, or one being written


def stale_records(directory: Path = RECORD_DIR) -> list[RunRecord]:
    """Records of runs whose owner process is no longer alive."""
    return [rec for rec in _records(directory) if not rec.owner_alive()]


def live_records(directory: Path = RECORD_DIR) -> list[RunRecord]:
    """Records of runs still going (their owner process is alive)."""
    return [rec for rec in _records(directory) if rec.owner_alive()]
