"""What the harness runs on a server of a cluster, over ssh (``python -m`` this module).

* ``launch --log PATH -- CMD...``: print ``{"pid", "started"}`` as one JSON line, then
  become CMD (same PID) with its output appended to PATH;
* ``launch --log PATH --starter NAME --ns-pid PID [--cgroups DIR,...] -- ARGS...``:
  ask the agent starter listening on NAME there (``forkserver.py``) for a fork that
  runs ARGS in the namespaces of process PID (and in the cgroups DIR, a CPU-limited
  host's), print its ``{"pid", "started"}``, wait for its end and exit with its
  status;
* ``port``: a free TCP port of the server;
* ``remove`` / ``leftovers``: a run record's part for this server (JSON on stdin:
  ``processes``, ``interfaces``, ``nft_tables``, ``cgroups``) removed, or what of it still
  exists, one line each;
* ``follow DIR``: the run's directory on a server that does not share it (see
  ``harness/running/rundir.py``): made, then every file added or grown under it sent
  on stdout while files sent on stdin are written there, until stdin ends;
* ``rmtree DIR TOP``: DIR removed, then its parents up to TOP while they are empty;
* ``captures wait|stop TOOL N``: the run's packet captures there (``remotecapture.py``);
* ``cpulimit``: why hosts cannot be CPU-limited here (``--host-cpu``), or nothing;
* ``strays JSON``: what was started by hand from Mininet's CLI here (``mncli.strays``:
  JSON ``{"shells", "hosts", "known"}``, lists of PIDs of this server), one JSON line
  ``{"pid", "started", "what"}`` each;
* ``version``: the project's version here.
"""

from __future__ import annotations

import json
import os
import socket
import sys


USAGE = "usage: launch --log PATH [--starter NAME --ns-pid PID [--cgroups DIR,...]] -- CMD..."


def launch_options(args: list[str]) -> dict | None:
    """``launch``'s options, everything before ``--``, and the command after it:
    ``{"log", "starter", "ns_pid", "cgroups", "cmd"}``; None when they are wrong (no
    ``--log``, no command, an unknown or repeated option, ``--starter`` without a
    numeric ``--ns-pid``, ``--cgroups`` without ``--starter``)."""
    if "--" not in args:
        return None
    split = args.index("--")
    words, cmd = args[:split], args[split + 1:]
    if len(words) % 2 or not cmd:
        return None
    options = {}
    for flag, value in zip(words[::2], words[1::2]):
        if flag not in ("--log", "--starter", "--ns-pid", "--cgroups") or flag in options:
            return None
        options[flag] = value
    forked = "--starter" in options
    if not options.get("--log") or forked != ("--ns-pid" in options) \
            or ("--cgroups" in options and not forked) \
            or (forked and not options["--ns-pid"].isdigit()):
        return None
    cgroups = options.get("--cgroups", "")
    return {"log": options["--log"], "starter": options.get("--starter"),
            "ns_pid": int(options["--ns-pid"]) if forked else None,
            "cgroups": [c for c in cgroups.split(",") if c], "cmd": cmd}


def launch(args: list[str]) -> int:
    options = launch_options(args)
    if options is None:
        print(USAGE, file=sys.stderr)
        return 2
    if options["starter"] is not None:
        return launch_forked(options["log"], options["starter"], options["ns_pid"],
                             options["cmd"], options["cgroups"])
    import psutil
    import shutil
    log, cmd = options["log"], options["cmd"]
    if shutil.which(cmd[0]) is None:  # said here, before a PID is given for it
        print(f"launch: {cmd[0]}: no such command here", file=sys.stderr)
        return 127
    try:
        os.makedirs(os.path.dirname(os.path.abspath(log)), exist_ok=True)
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    except OSError as exc:
        print(f"launch: log {log}: {exc.strerror or exc}", file=sys.stderr)
        return 2
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


def launch_forked(log: str, starter: str, ns_pid: int, argv: list[str],
                  cgroups: list[str] = (), timeout: float = 300.0) -> int:
    """``launch --starter``: the fork's PID and start time as ``launch`` prints its
    own, then its exit status (a signal N as 128 + N, as a shell gives it)."""
    import psutil
    try:
        os.makedirs(os.path.dirname(os.path.abspath(log)), exist_ok=True)
    except OSError as exc:
        print(f"launch: log {log}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(timeout)  # for the starter's answer (it may still be loading)
    try:
        conn.connect("\0" + starter)
        request = {"n": 1, "argv": argv, "ns_pid": ns_pid, "log": log,
                   "cgroups": list(cgroups)}
        conn.sendall(json.dumps(request).encode() + b"\n")
        news = conn.makefile("rb")
        answer = json.loads(news.readline())
        if "pid" not in answer:
            raise OSError(answer.get("error", "no fork"))
        pid = answer["pid"]
        try:
            started = psutil.Process(pid).create_time()
        except psutil.Error:  # ended already
            started = None
        print(json.dumps({"pid": pid, "started": started}), flush=True)
        conn.settimeout(None)
        ended = json.loads(news.readline())
    except (OSError, ValueError) as exc:
        print(f"agent starter {starter} on {socket.gethostname()}: {exc}", flush=True)
        return 1
    status = ended["status"]
    return status if status >= 0 else 128 - status


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def record_part(action: str) -> int:
    from .record import RunRecord, part_problem
    try:
        entry = json.loads(sys.stdin.read() or "{}")
    except ValueError as exc:
        entry, problem = None, f"not JSON ({exc})"
    else:
        problem = part_problem(entry)
    if problem:
        print(f"{action}: stdin is not a run record's part for this server: {problem}",
              file=sys.stderr)
        return 2
    rec = RunRecord.__new__(RunRecord)
    rec.data = {"processes": entry.get("processes", []),
                "interfaces": entry.get("interfaces", []),
                "nft_tables": entry.get("nft_tables", []),
                "cgroups": entry.get("cgroups", [])}
    lines = rec.remove_resources() if action == "remove" else rec.leftovers(wait=1.0)
    for line in lines:
        print(line)
    return 0


def rmtree(directory: str, top: str) -> int:
    import shutil
    path, top_path = os.path.realpath(directory), os.path.realpath(top)
    if not (path == top_path or path.startswith(top_path + "/")) or top_path == "/":
        print(f"rmtree: {directory} is not under {top}", file=sys.stderr)
        return 2
    shutil.rmtree(path, ignore_errors=True)
    while path != top_path:
        path = os.path.dirname(path)
        try:
            os.rmdir(path)
        except OSError:
            break
    return 0


def strays(request: str) -> int:
    try:
        asked = json.loads(request)
        shells, hosts, known = ({int(p) for p in asked[k]} for k in ("shells", "hosts", "known"))
    except (ValueError, TypeError, KeyError) as exc:
        print(f"strays: a JSON object of PID lists shells, hosts, known: {exc}", file=sys.stderr)
        return 2
    from .mncli import stray_entries
    for entry in stray_entries(shells, hosts, known):
        print(json.dumps(entry))
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
    if action == "follow" and len(rest) == 1:
        from .follow import follow
        return follow(rest[0])
    if action == "rmtree" and len(rest) == 2:
        return rmtree(*rest)
    if action == "captures":
        from .remotecapture import serve
        return serve(rest)
    if action == "strays" and len(rest) == 1:
        return strays(rest[0])
    if action == "cpulimit":  # why hosts cannot be CPU-limited here (nothing: they can)
        from .cpulimit import limit_problem
        print(limit_problem() or "")
        return 0
    if action == "version":
        from importlib.metadata import version
        print(version("qaina-bench"))
        return 0
    print(f"unknown action {action!r}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
