"""The run's directory on a server that does not share it, kept in step with the
harness over one ssh session (``remote follow DIR``; the harness's side is
``harness/running/rundir.py``).

On stdout: first ``{"pid", "started", "made"}`` (``made``: the topmost directory it
had to create, None when DIR existed), then, every ``INTERVAL``, each file under DIR
that is new or has grown as a header line ``{"file": RELATIVE, "at": OFFSET, "size":
N}`` followed by its N new bytes (``at`` 0 for a file that shrank: sent whole). On
stdin: lines ``{"id", "file", "data"}``, each a file the harness writes there (whole,
by a rename), answered by ``{"ack": id}`` once it is in place. It ends when stdin ends.
What lies under ``DIR/.inputs`` (copies the harness made there for the remote
processes to read) is never sent, nor ``DIR/pcap`` (captures: copied at the end).
"""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path

INTERVAL = 0.05
CHUNK = 1 << 20  # at most this much of one file per message
#: the subdirectory that holds what the harness copied there to be read (a trace set):
#: never sent back
INPUTS = ".inputs"
#: top directories not followed: those inputs, and packet captures (``--pcap``), which
#: come back with the copy at the end
UNFOLLOWED = (INPUTS, "pcap")


def make_directory(directory: Path) -> str | None:
    """``directory`` made with its parents; the topmost one made (None: it existed)."""
    top = None
    for parent in reversed([directory, *directory.parents]):
        if not parent.exists():
            top = top or str(parent)
    directory.mkdir(parents=True, exist_ok=True)
    return top


class Follower:
    """Sends what grows under ``directory``, writes what it is sent there."""

    def __init__(self, directory: Path, out):
        self.directory = directory
        self.out = out
        self.sizes: dict[str, int] = {}
        self.lock = threading.Lock()

    def send(self, header: dict, data: bytes = b""):
        with self.lock:
            self.out.write(json.dumps(header).encode() + b"\n" + data)
            self.out.flush()

    def scan(self):
        """Every file under the directory that is new or has grown since the last scan."""
        for path in sorted(self.directory.rglob("*")):
            rel = str(path.relative_to(self.directory))
            if rel.split(os.sep, 1)[0] in UNFOLLOWED:
                continue
            try:
                if not path.is_file() or path.name.startswith(".put-"):
                    continue
                size = path.stat().st_size
                with self.lock:
                    known = self.sizes.get(rel, 0)
                    if size == known and rel in self.sizes:
                        continue
                at = known if size >= known else 0
                with open(path, "rb") as f:
                    f.seek(at)
                    data = f.read(min(size - at, CHUNK))
            except OSError:
                continue  # gone meanwhile: the next scan sees what replaced it
            with self.lock:
                self.sizes[rel] = at + len(data)
            self.send({"file": rel, "at": at, "size": len(data)}, data)

    def receive(self, line: bytes):
        """One file the harness sends: written whole, then acknowledged."""
        msg = json.loads(line)
        path = self.directory / msg["file"]
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".put-{path.name}")
        data = msg["data"].encode()
        tmp.write_bytes(data)
        os.replace(tmp, path)
        with self.lock:
            self.sizes[msg["file"]] = len(data)  # the harness has it: not sent back
        self.send({"ack": msg["id"]})


def follow(directory: str) -> int:
    import psutil
    path = Path(directory)
    made = make_directory(path)
    follower = Follower(path, sys.stdout.buffer)
    follower.send({"pid": os.getpid(), "started": psutil.Process().create_time(),
                   "made": made})
    done = threading.Event()

    def read_stdin():
        try:
            for line in sys.stdin.buffer:
                if line.strip():
                    follower.receive(line)
        finally:
            done.set()

    threading.Thread(target=read_stdin, daemon=True).start()
    try:
        while not done.wait(INTERVAL):
            follower.scan()
        follower.scan()
    except BrokenPipeError:
        pass  # the harness went away
    return 0
