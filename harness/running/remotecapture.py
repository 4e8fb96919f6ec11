"""``--pcap`` on the other servers of a cluster (``--cluster``).

A capture of an interface of a node on another server runs on that server, in the
node's namespace, started by ``remote launch`` (recorded there by its PID like the
remote switches and agents, so ``clean`` stops it after a ``kill -9``), and writes
into ``pcap/`` of the run's directory there under the name a local capture has. The
followers leave ``pcap/`` alone (a capture's bytes do not cross during the run); it
comes back with the rest of the server's part at the end. One ssh session per server
(``remote captures wait|stop TOOL``, JSON on stdin: one ``{"pid", "file", "log"}``
per capture) waits until its tools capture, and at the end lets the last frames
reach them, stops them and says what each captured, so ``captures.json`` reads as a
local run's, with the server of each remote file.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .capture import DRAIN_S, Capture, CaptureError, capturing
from .cluster import Server, run_remote


def command(cmd: list[str]) -> list[str]:
    """A capture's command line for ``remote launch``: the tool found on that server's
    PATH (ssh passes the words on unquoted: none has a space or a quote)."""
    return [Path(cmd[0]).name] + cmd[1:]


def entries(captures: list[Capture]) -> list[dict]:
    return [{"pid": c.remote_pid, "file": str(c.path), "log": str(c.log)} for c in captures]


def by_server(captures: list[Capture]) -> dict[str, list[Capture]]:
    out: dict[str, list[Capture]] = {}
    for c in captures:
        out.setdefault(c.server, []).append(c)
    return out


def wait_remote(captures: list[Capture], tool: str, timeout: float):
    """Until every remote capture's tool captures; CaptureError (one line) if one does
    not, naming its server."""
    for server, mine in by_server(captures).items():
        res = run_remote(Server(server, mine[0].user), ["captures", "wait", tool,
                                                        str(timeout)],
                         json.dumps(entries(mine)), timeout=timeout + 30)
        if res.returncode != 0:
            why = (res.stderr or res.stdout).strip().splitlines() or ["no answer"]
            raise CaptureError(f"{server}: {why[-1]}")


def stop_remote(captures: list[Capture], tool: str, limit_mb: int) -> dict[int, dict]:
    """Every remote capture stopped on its server (all servers at once); remote PID ->
    ``{"bytes", "captured", "dropped"}`` (None each for a server that did not answer)."""
    def stop(item):
        server, mine = item
        try:
            res = run_remote(Server(server, mine[0].user), ["captures", "stop", tool,
                                                            str(limit_mb)],
                             json.dumps(entries(mine)), timeout=60)
            return json.loads(res.stdout) if res.returncode == 0 else {}
        except (OSError, ValueError, subprocess.TimeoutExpired):
            return {}
    out: dict[int, dict] = {}
    groups = list(by_server(captures).items())
    with ThreadPoolExecutor(max(1, len(groups))) as pool:
        for found in pool.map(stop, groups):
            out.update({int(pid): v for pid, v in found.items()})
    return out


# -- on the server ------------------------------------------------------------------

def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:  # a zombie of ``remote launch``'s exec is gone for us
        return open(f"/proc/{pid}/stat").read().split(") ")[-1][:1] != "Z"
    except OSError:
        return False


def serve_wait(items: list[dict], tool: str, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    waiting = list(items)
    while waiting:
        for item in list(waiting):
            if Path(item["file"]).exists() and capturing(item["pid"]):
                waiting.remove(item)
            elif not _alive(item["pid"]):
                log = Path(item["log"])
                text = log.read_text(errors="replace") if log.exists() else ""
                last = text.strip().splitlines()[-1:] or ["no output"]
                print(f"{tool} on {Path(item['file']).stem} exited: {last[0]} (log {log})",
                      file=sys.stderr)
                return 1
        if waiting and time.monotonic() > deadline:
            print(f"{tool} on {Path(waiting[0]['file']).stem} did not start capturing "
                  f"within {timeout:g} s (log {waiting[0]['log']})", file=sys.stderr)
            return 1
        time.sleep(0.02)
    return 0


def _runs(pid: int, tool: str) -> bool:
    """Whether process ``pid`` is ``tool`` (a PID given is signalled only if it is)."""
    try:
        return open(f"/proc/{pid}/comm").read().strip() == tool[:15]
    except OSError:
        return False


def serve_stop(items: list[dict], tool: str, limit_mb: int, wait: float = 5.0) -> int:
    running = [i for i in items if _alive(i["pid"]) and _runs(i["pid"], tool)]
    if running:  # the last frames reach the tools (capture.py, ``_drain``)
        time.sleep(DRAIN_S.get(tool, 0.6))
        sizes, deadline = None, time.monotonic() + 3.0
        while time.monotonic() < deadline:
            now = [os.path.getsize(i["file"]) if os.path.exists(i["file"]) else 0
                   for i in running]
            if now == sizes:
                break
            sizes = now
            time.sleep(0.2)
    for item in running:
        os.kill(item["pid"], signal.SIGTERM)
    deadline = time.monotonic() + wait
    for item in running:
        while _alive(item["pid"]) and time.monotonic() < deadline:
            time.sleep(0.05)
        if _alive(item["pid"]):
            os.kill(item["pid"], signal.SIGKILL)
    out = {}
    for item in items:
        path = Path(item["file"])
        size = path.stat().st_size if path.exists() else None
        if size is not None:
            os.chmod(path, 0o644)
        counts = Capture("", "", path, Path(item["log"])).counts(tool)
        out[item["pid"]] = {"bytes": size, **counts}
    print(json.dumps(out))
    return 0


def serve(args: list[str]) -> int:
    """``captures wait TOOL TIMEOUT`` or ``captures stop TOOL LIMIT_MB``, the captures
    as JSON on stdin."""
    usage = "usage: captures wait TOOL TIMEOUT | captures stop TOOL LIMIT_MB"
    try:
        if len(args) != 3 or args[0] not in ("wait", "stop"):
            raise ValueError("wrong arguments")
        number = float(args[2]) if args[0] == "wait" else int(args[2])
        if not 0 <= number < 1e6:
            raise ValueError(f"{args[2]} out of range")
        items = json.loads(sys.stdin.read() or "[]")
        if not isinstance(items, list) or not all(
                isinstance(i, dict) and isinstance(i.get("pid"), int)
                and isinstance(i.get("file"), str) and isinstance(i.get("log"), str)
                for i in items):
            raise ValueError("stdin is not a list of captures {pid, file, log}")
    except ValueError as exc:
        print(f"{usage} ({exc})", file=sys.stderr)
        return 2
    if args[0] == "wait":
        return serve_wait(items, args[1], number)
    return serve_stop(items, args[1], number)
