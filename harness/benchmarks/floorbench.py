"""``bench floor``: the least CPU an aggregated element costs the agents on this machine.

Whatever a run's Python does per batch, each of a job's ``n`` workers sends every
chunk in one datagram, receives its result in another, and quantizes, packs, unpacks
and dequantizes every element. This benchmark measures those two parts apart from
everything else:

* **a datagram and its answer**: a worker process sends chunk-sized datagrams (the
  ``--payload-words`` build's) with a window in flight to a peer that returns each;
  both run in network namespaces of their own joined by a veth pair, as Mininet's
  hosts are. Two ways: ``sockets``, a UDP socket with one ``sendto`` and one
  ``recvfrom_into`` per datagram (what the agents do), and ``rings``, PACKET_MMAP
  rings with one call per block sent and none per frame received (what the embedded
  switch's ports do; an agent would have to build and filter its frames itself).
  The worker's CPU time (user and system, which on this kernel also carries the
  softirq work its calls set off) per answer received is its cost per chunk; the
  peer's, and the whole machine's busy time (niced work left out), are printed
  beside it;
* **the kernels**: ``bench codec``'s figures for the agents' one-pass encode and
  decode (random numbers included), best of several timings on one core.

Per million aggregated elements at ``n`` workers, a chunk of ``E`` elements (words x
lanes of the format): ``n x chunk cost / E`` for the packets and ``n x (encode +
decode)`` for the arithmetic; their sum is a floor for the agents alone, with nothing
for Python per batch, the switch, the harness or waiting on a shared core. The
machine's busy time per answer, less the worker's, bounds what the other end (the
switch, in a run) and the kernel's work outside both cost at least.
"""

from __future__ import annotations

import json
import os
import resource
import select
import socket
import subprocess
import sys
import time

import numpy as np

from ...hosts.codec_bench import measure as codec_measure
from ...hosts.lanes import LaneFormat
from ...p4.header import wire
from ..results.fidelity import BUSY_STATES
from ..running.cpustat import machine_times
from ..running.record import RunRecord

WORKER_IP, PEER_IP = "10.213.0.1", "10.213.0.2"  # inside the benchmark's own namespaces
PORT = 20999
SETTLE_S = 10.0  # the longest an endpoint waits for its interface, or for a datagram
ETH_HLEN = 14
ETHERTYPE = b"\x88\xb5"  # IEEE 802 local experimental: the benchmark's own frames
RING_READ = 256  # frames a ring endpoint takes per read at most
METHODS = ("sockets", "rings")


class FloorError(RuntimeError):
    """The benchmark could not measure (one line: what failed)."""


def _ip(*args: str):
    """``ip ARGS``; FloorError with what it said when it fails."""
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode:
        raise FloorError(f"ip {' '.join(args)}: {done.stderr.strip() or 'failed'}"
                         + (" (a benchmark killed before? qaina-bench clean removes what "
                            "it left)" if "exists" in done.stderr else ""))


def _configure(ifname: str, address: str):
    """In this process's fresh namespace: wait until ``ifname`` has been moved in, then
    give it ``address`` and bring it and loopback up."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        try:
            socket.if_nametoindex(ifname)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise FloorError(f"{ifname} never arrived in the namespace")
            time.sleep(0.01)
    with open("/proc/sys/net/ipv6/conf/all/disable_ipv6", "w") as f:
        f.write("1")  # no router solicitations or MLD reports among the frames
    _ip("addr", "add", f"{address}/24", "dev", ifname)
    _ip("link", "set", ifname, "up")
    _ip("link", "set", "lo", "up")


def _socket(address: str) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)  # as the agents'
    sock.bind((address, PORT))
    sock.setblocking(False)
    return sock


def _drain(sock, view, on_datagram) -> int:
    """Read every datagram that is ready into ``view``, calling ``on_datagram(size,
    sender)`` for each; returns how many."""
    got = 0
    while True:
        try:
            size, sender = sock.recvfrom_into(view, 0, socket.MSG_TRUNC)
        except BlockingIOError:
            return got
        got += 1
        on_datagram(size, sender)


def _worker(sock, size: int, count: int, window: int) -> dict:
    """Send ``count`` datagrams of ``size`` bytes, at most ``window`` unanswered; a
    datagram the kernel refuses (a full queue) or whose answer is lost is not waited
    for."""
    view = memoryview(bytearray(size))
    poll = select.poll()
    poll.register(sock, select.POLLIN)
    dest = (PEER_IP, PORT)
    sent = errors = 0
    got = [0]

    def answer(n, sender):
        got[0] += 1

    quiet_since = time.monotonic()
    while got[0] + errors < count:
        while sent < count and sent - errors - got[0] < window:
            try:
                sock.sendto(view, dest)
            except OSError:
                errors += 1
            sent += 1
        if poll.poll(100):
            if _drain(sock, view, answer):
                quiet_since = time.monotonic()
        elif time.monotonic() - quiet_since > 1.0:
            break  # the rest were lost
    return {"sent": sent, "send_errors": errors, "answers": got[0]}


def _peer(sock, size: int, count: int) -> dict:
    """Send every datagram back to its sender until ``count`` came or none for a while."""
    view = memoryview(bytearray(size))
    poll = select.poll()
    poll.register(sock, select.POLLIN)
    got = 0

    def echo(n, sender):
        try:
            sock.sendto(view[:min(n, size)], sender)
        except OSError:
            pass

    while got < count:
        if not poll.poll(1000):
            break
        got += _drain(sock, view, echo)
    return {"echoed": got}


def _is_ours(buf) -> bool:
    return bytes(buf[12:14]) == ETHERTYPE


def _ours(slots, lengths, frames) -> int:
    """How many of a read's frames carry the benchmark's EtherType."""
    if not lengths:
        return 0
    if frames is None:  # some had to be copied apart: look at each
        return sum(1 for buf, _ in slots if _is_ours(buf))
    return int(np.count_nonzero((frames[:len(lengths), 12] == ETHERTYPE[0])
                                & (frames[:len(lengths), 13] == ETHERTYPE[1])))


def _ring_frames(size: int, count: int) -> np.ndarray:
    """``count`` Ethernet frames carrying ``size`` bytes each, of a local experimental
    EtherType (no protocol of the namespaces' stacks takes them)."""
    frames = np.zeros((count, ETH_HLEN + size), dtype=np.uint8)
    frames[:, 0:6] = 0xFF
    frames[:, 6:12] = (0x02, 0, 0, 0, 0, 1)
    frames[:, 12:14] = tuple(ETHERTYPE)
    return frames


def _ring_worker(port, size: int, count: int, window: int) -> dict:
    """``_worker`` through PACKET_MMAP rings: a block of frames per send call, every
    ready frame per read."""
    block = _ring_frames(size, window)
    poll = select.poll()
    poll.register(port.sock, select.POLLIN)
    sent = got = 0
    quiet_since = time.monotonic()
    while got < count:
        room = min(window - (sent - got), count - sent)
        if room >= min(window // 4 or 1, count - sent) and room > 0:
            port.send_block(block[:room])
            port.flush()
            sent += room
        events = poll.poll(100)
        if events:
            if _broken(port, events):
                break
            slots, lengths, frames = port.receive(RING_READ)
            ours = _ours(slots, lengths, frames)
            port.release()
            if ours:
                got += ours
                quiet_since = time.monotonic()
        elif time.monotonic() - quiet_since > 1.0:
            break
    return {"sent": sent, "send_errors": port.tx_errors, "answers": got}


def _ring_peer(port, size: int, count: int) -> dict:
    """``_peer`` through PACKET_MMAP rings: every frame of a read back in one block."""
    poll = select.poll()
    poll.register(port.sock, select.POLLIN)
    got = 0
    quiet_since = time.monotonic()
    while got < count and time.monotonic() - quiet_since < 1.0:
        events = poll.poll(1000)
        if _broken(port, events):
            break
        slots, lengths, frames = port.receive(RING_READ)
        ours = _ours(slots, lengths, frames)
        if ours == len(lengths) and frames is not None and ours:
            port.send_block(frames[:ours, :ETH_HLEN + size])
        elif ours:  # others among them: ours one by one
            for buf, _ in slots:
                if _is_ours(buf):
                    port.send(buf[:ETH_HLEN + size])
        if ours:
            port.flush()
            got += ours
            quiet_since = time.monotonic()
        port.release()
    return {"echoed": got}


def _broken(port, events) -> bool:
    """The port's interface is gone (the other end's namespace went, and the veth
    pair with it). An error the socket reports (the link went down and up, say) is
    read, and so cleared: poll reports it until then."""
    if not any(ev & (select.POLLERR | select.POLLHUP | select.POLLNVAL) for _, ev in events):
        return False
    port.clear_error()
    try:
        socket.if_nametoindex(port.ifname)
    except OSError:
        return True
    return False


def endpoint(method: str, role: str, ifname: str, size: int, count: int, window: int):
    """One endpoint, run inside ``unshare --net``: configure, say ready, wait for the
    go on standard input, run, print what it did and its CPU time as JSON."""
    address = WORKER_IP if role == "worker" else PEER_IP
    print("in", flush=True)  # in a namespace of its own now: the interface may come
    _configure(ifname, address)
    if method == "rings":
        from ...p4.embedded.ports import Port
        port = Port(1, ifname)
        if port.rx_mode != "ring" or port.tx_mode != "ring":
            raise FloorError(f"{ifname}: no PACKET_MMAP rings here")
        run = (lambda: _ring_worker(port, size, count, window)) if role == "worker" else (
            lambda: _ring_peer(port, size, count))
    else:
        sock = _socket(address)
        run = (lambda: _worker(sock, size, count, window)) if role == "worker" else (
            lambda: _peer(sock, size, count))
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        return
    usage0, wall0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    done = run()
    usage, wall = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    done.update(cpu_s=usage.ru_utime - usage0.ru_utime + usage.ru_stime - usage0.ru_stime,
                wall_s=wall - wall0)
    print(json.dumps(done), flush=True)


class _Pair:
    """The veth pair and the two endpoint processes in namespaces of their own; every
    name and PID in ``record`` before it exists, so that ``clean`` removes it."""

    def __init__(self, record: RunRecord):
        prefix = f"qb{os.getpid() % 10000}f"
        self.ends = (f"{prefix}w", f"{prefix}p")
        self.procs: list[subprocess.Popen] = []
        self.record = record
        self.made = False

    def start(self, method: str, size: int, count: int, window: int):
        record = self.record
        for name in self.ends:
            record.add_interface(name)
        record.save()
        _ip("link", "add", self.ends[0], "type", "veth", "peer", "name", self.ends[1])
        self.made = True
        for role, name in zip(("worker", "peer"), self.ends):
            proc = subprocess.Popen(
                ["unshare", "--net", "--", sys.executable, "-m", __name__, method, role,
                 name, str(size), str(count), str(window)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            self.procs.append(proc)
            record.add_process(proc.pid, f"floor benchmark {role}")
            if proc.stdout.readline().strip() != "in":  # moved before it unshared, the
                raise FloorError(f"the floor benchmark's {role} did not start (exit "
                                 f"{proc.wait(SETTLE_S)}; what it said is above)")
            _ip("link", "set", name, "netns", str(proc.pid))  # interface would stay here

    def run(self, timeout: float) -> tuple[dict, dict]:
        for proc in self.procs:
            if proc.stdout.readline().strip() != "ready":
                raise FloorError(f"a floor benchmark endpoint did not start (exit "
                                 f"{proc.wait(SETTLE_S)}; what it said is above)")
        peer, worker = self.procs[1], self.procs[0]
        peer.stdin.write("go\n")
        peer.stdin.flush()
        worker.stdin.write("go\n")
        worker.stdin.flush()
        busy0 = busy_seconds()
        out = {}
        for role, proc in (("worker", worker), ("peer", peer)):
            try:
                line, _ = proc.communicate(timeout=timeout)
                out[role] = json.loads(line.strip().splitlines()[-1])
            except (subprocess.TimeoutExpired, ValueError, IndexError):
                raise FloorError(f"the {role} did not finish within {timeout:.0f} s "
                                 f"(exit {proc.poll()})") from None
        out["worker"]["machine_s"] = busy_seconds() - busy0
        return out["worker"], out["peer"]

    def remove(self):
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        # the namespaces went with their processes, and the pair with them; a pair
        # left in this namespace (stopped before it moved) goes here
        if self.made:
            subprocess.run(["ip", "link", "del", self.ends[0]], capture_output=True)


def datagram_cost(method: str, words: int, count: int, window: int) -> dict:
    """One measurement: the worker's and the peer's CPU microseconds per answered
    datagram of a ``words``-word chunk, sent and received by ``method``: ``sockets``
    (a UDP socket, one call per datagram, as the agents) or ``rings`` (PACKET_MMAP
    rings, a call per block, as the embedded switch's ports)."""
    record = RunRecord(f"bench-{os.getpid()}-{time.monotonic_ns() % 10**9}")
    pair = _Pair(record)
    try:
        pair.start(method, wire(words).datagram_len, count, window)
        worker, peer = pair.run(timeout=max(60.0, count / 1000))
    finally:
        pair.remove()
        record.close()
    answered = worker["answers"]
    if not answered:
        raise FloorError("no datagram was answered")
    return {"worker_us": 1e6 * worker["cpu_s"] / answered,
            "peer_us": 1e6 * peer["cpu_s"] / answered,
            "machine_us": 1e6 * worker["machine_s"] / answered,
            "answered": answered, "lost": count - answered,
            "rate": answered / worker["wall_s"]}


def busy_seconds() -> float:
    """CPU seconds every core of the machine has spent busy since boot, in the states
    the fidelity verdict counts as busy (``BUSY_STATES``: niced work yields)."""
    times = machine_times()
    return sum(times[state] for state in BUSY_STATES)


def floor_table(words: int, bits_list: list[int], workers_list: list[int], count: int,
                window: int, repeat: int, methods=METHODS, echo=print) -> list[dict]:
    """``bench floor``: the datagram cost of each method (``repeat`` runs each, mean
    and range), the kernels' cost, and the floor per million aggregated elements of
    each format with each method."""
    chunk_us = {}
    size = wire(words).datagram_len
    for method in methods:
        runs = [datagram_cost(method, words, count, window) for _ in range(repeat)]
        chunk = [r["worker_us"] for r in runs]
        chunk_us[method] = sum(chunk) / len(chunk)
        echo(f"{method}: a {size}-byte datagram ({words} words) sent and answered over "
             f"veth between two namespaces, {count} with {window} in flight, {repeat} "
             f"run(s): the worker {_spread(chunk)} us of CPU per chunk, the peer "
             f"{_spread([r['peer_us'] for r in runs])} us, the whole machine "
             f"{_spread([r['machine_us'] for r in runs])} us; "
             f"{min(r['rate'] for r in runs):,.0f}-{max(r['rate'] for r in runs):,.0f} "
             f"answers/s; lost {sum(r['lost'] for r in runs)}")
    echo(f"{'format':<22} {'elem/chunk':>10} {'encode ns':>9} {'decode ns':>9} "
         f"{'kernels':>8} " + " ".join(f"{m:>8} {'floor':>8}" for m in methods)
         + "  (CPU s per million aggregated elements, the job's agents together)")
    rows = []
    for bits in bits_list:
        for n in workers_list:
            fmt = LaneFormat(bits, n)
            elements = words * fmt.lanes
            codec = codec_measure(bits, n, 2**20, 20, words=words)
            enc, dec = 4e3 / codec["kernel_encode"], 4e3 / codec["kernel_decode"]
            kernels = n * (enc + dec) / 1e3
            row = {"format": fmt.describe(), "elements": elements, "encode_ns": enc,
                   "decode_ns": dec, "kernels": kernels}
            for method in methods:
                row[method] = n * chunk_us[method] / elements
                row[f"floor_{method}"] = row[method] + kernels
            rows.append(row)
            echo(f"{row['format']:<22} {elements:>10} {enc:>9.1f} {dec:>9.1f} "
                 f"{kernels:>8.3f} " + " ".join(
                     f"{row[m]:>8.3f} {row['floor_' + m]:>8.3f}" for m in methods))
    cores = len(os.sched_getaffinity(0))
    echo(f"on {cores} cores the agents alone could aggregate at most cores / floor "
         "million elements a second, in all jobs together")
    return rows


def _spread(values: list[float]) -> str:
    mean = sum(values) / len(values)
    if len(values) == 1:
        return f"{mean:.2f}"
    return f"{mean:.2f} ({min(values):.2f}-{max(values):.2f})"


if __name__ == "__main__":
    method, role, ifname, size, count, window = sys.argv[1:7]
    try:
        endpoint(method, role, ifname, int(size), int(count), int(window))
    except (FloorError, OSError) as exc:
        raise SystemExit(f"floor benchmark {role}: {exc}") from None
