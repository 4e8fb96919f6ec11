"""What the harness runs on a server of a cluster, over ssh (``python -m`` this module).

* ``launch --log PATH -- CMD...``: print ``{"pid", "started"}`` as one JSON line, then
  become CMD (same PID) with its output appended to PATH;
* ``port``: a free TCP port of the server;
* ``remove`` / ``leftovers``: a run record's part for this server (JSON on stdin:
  ``processes``, ``interfaces``, ``nft_tables``) removed, or what of it still
  exists, one line each;
* ``version``: the project's version here.
"""

from __future__ import annotations

import json
import os
import socket
import sys


def launch(args: list[str]) -> int:
    if len(args) < 4 or args[0] != "--log" or args[2] != "--":
        print("usage: launch --log PATH -- CMD...", file=sys.stderr)
        return 2
    import psutil
    log, cmd = args[1], args[3:]
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    print(json.dumps({"pid": os.getpid(), "started": psutil.Process().create_time()}),
          flush=True)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    try:
        os.setsid()  # its own session: the ssh connection's hangup does not reach it
    except OSError:
        pass  # a session leader already
    os.execvp(cmd[0], cmd)
    return 127


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def record_part(action: str) -> int:
    from .record import RunRecord
    entry = json.loads(sys.stdin.read() or "{}")
    rec = RunRecord.__new__(RunRecord)
    rec.data = {"processes": entry.get("processes", []),
                "interfaces": entry.get("interfaces", []),
                "nft_tables": entry.get("nft_tables", []), "cgroups": []}
    lines = rec.remove_resources() if action == "remove" else rec.leftovers(wait=1.0)
    for line in lines:
        print(line)
    return 0


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    action, rest = argv[0], argv[1:]
    if action == "launch":
        return launch(rest)
    if action == "port":
        print(free_port())
        return 0
    if action in ("remove", "leftovers"):
        return record_part(action)
    if action == "version":
        from importlib.metadata import version
        print(version("qaina-bench"))
        return 0
    print(f"unknown action {action!r}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
