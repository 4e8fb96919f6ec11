"""Ring all-reduce between the workers of a job: the host-based baseline.

Each worker keeps one TCP connection to the next worker of the ring and one from the
previous. ``all_reduce`` runs the usual reduce-scatter (n - 1 steps) and all-gather
(n - 1 steps), each step sending a 1/n segment to the next worker while receiving
one from the previous, so every worker sends and receives 2 (n - 1) / n of the
vector. The switches only route: the same fabric, no in-network aggregation.

With packed lanes the reduction is the switch's: wrapping 32-bit addition of words,
exact in the integer domain; scales are agreed first with a max all-reduce of the
chunks' exponents.

Every TCP socket of the baselines is made by ``tcp_socket`` with the run's congestion
control (``--tcp-cc``), set on the socket itself: a privileged process may pick any
algorithm the kernel has that way, where a network namespace's default may only be
one of ``net.ipv4.tcp_allowed_congestion_control``.
"""

from __future__ import annotations

import socket
import struct
import threading
import time

import numpy as np


class RingError(RuntimeError):
    """The ring could not be formed or broke."""


#: offset of ``tcpi_total_retrans`` in Linux's ``struct tcp_info`` (include/uapi/linux/tcp.h)
_TOTAL_RETRANS = 100


def tcp_retransmissions(sock: socket.socket | None) -> int:
    """Segments the kernel retransmitted on ``sock`` so far (0 where TCP_INFO is not
    available)."""
    if sock is None:
        return 0
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TOTAL_RETRANS + 4)
    except OSError:
        return 0
    return struct.unpack_from("I", info, _TOTAL_RETRANS)[0] if len(info) >= 104 else 0


def tcp_socket(congestion: str | None, error=OSError) -> socket.socket:
    """A TCP socket using the congestion control ``congestion`` (None: the host's
    default); raises ``error`` when the kernel refuses it."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if congestion:
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, congestion.encode())
        except OSError as exc:
            sock.close()
            raise error(f"TCP congestion control {congestion!r} refused: {exc.strerror}; "
                        "see /proc/sys/net/ipv4/tcp_available_congestion_control") from None
    return sock


def congestion_control(*socks: socket.socket | None) -> str | None:
    """The congestion control the open ones of ``socks`` use, comma-separated where
    they differ; None for none open."""
    names = set()
    for sock in socks:
        if sock is not None and sock.fileno() >= 0:
            raw = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16)
            names.add(raw.split(bytes(1))[0].decode())
    return ",".join(sorted(names)) or None


def connect_until(address: tuple[str, int], deadline: float, error, what: str,
                  congestion: str | None = None) -> socket.socket:
    """A TCP connection to ``address`` using the congestion control ``congestion``,
    retried until ``deadline`` (monotonic); raises ``error`` naming ``what`` when it
    cannot be had."""
    while True:
        sock = tcp_socket(congestion, error)
        try:
            sock.settimeout(2)
            sock.connect(address)
            return sock
        except OSError as exc:
            sock.close()
            if time.monotonic() > deadline:
                raise error(f"cannot reach {what} at {address[0]}:{address[1]}: {exc}") from None
            time.sleep(0.05)


class Ring:
    """This worker's place in a ring of ``len(peers)`` workers; ``peers`` are the
    workers' (address, TCP port) in ring order; its connections use the TCP congestion
    control ``congestion`` (None: the host's default)."""

    def __init__(self, worker: int, peers: list[tuple[str, int]],
                 congestion: str | None = None):
        self.worker = worker
        self.peers = [(str(a), int(p)) for a, p in peers]
        self.n = len(peers)
        self.next_sock = self.prev_sock = None
        self.bytes_sent = 0
        self.bytes_received = 0
        self.congestion = congestion
        self.listener = tcp_socket(congestion, RingError)  # accepted sockets inherit it
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("0.0.0.0", self.peers[worker][1]))
        self.listener.listen(1)

    def connect(self, timeout: float = 60.0):
        """Connect to the next worker and accept the previous one."""
        if self.n == 1:
            return
        target = self.peers[(self.worker + 1) % self.n]
        deadline = time.monotonic() + timeout
        self.next_sock = connect_until(target, deadline, RingError, "the next worker",
                                       self.congestion)
        self.listener.settimeout(max(1.0, deadline - time.monotonic()))
        try:
            self.prev_sock, _ = self.listener.accept()
        except socket.timeout:
            raise RingError("the previous worker of the ring never connected") from None
        for s in (self.next_sock, self.prev_sock):
            s.settimeout(None)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def _step(self, outgoing: np.ndarray, incoming_bytes: int) -> bytes:
        """Send ``outgoing`` to the next worker while receiving from the previous."""
        error = []

        def send():
            try:
                self.next_sock.sendall(outgoing.tobytes())
            except OSError as exc:
                error.append(exc)

        sender = threading.Thread(target=send)
        sender.start()
        data = bytearray(incoming_bytes)
        view = memoryview(data)
        got = 0
        while got < incoming_bytes:
            n = self.prev_sock.recv_into(view[got:])
            if n == 0:
                raise RingError("the previous worker closed the ring")
            got += n
        sender.join()
        if error:
            raise RingError(f"sending to the next worker failed: {error[0]}")
        self.bytes_sent += outgoing.nbytes
        self.bytes_received += incoming_bytes
        return bytes(data)

    def all_reduce(self, data: np.ndarray, op) -> np.ndarray:
        """Reduce ``data`` in place over the ring with the ufunc ``op`` (add, maximum)."""
        n, k = self.n, self.worker
        if n == 1:
            return data
        bounds = [len(data) * i // n for i in range(n + 1)]

        def segment(i):
            i %= n
            return data[bounds[i]:bounds[i + 1]]

        for s in range(n - 1):  # reduce-scatter
            mine = segment(k - s - 1)
            incoming = self._step(segment(k - s), mine.nbytes)
            op(mine, np.frombuffer(incoming, dtype=data.dtype), out=mine)
        for s in range(n - 1):  # all-gather
            mine = segment(k - s)
            mine[:] = np.frombuffer(self._step(segment(k - s + 1), mine.nbytes),
                                    dtype=data.dtype)
        return data

    @property
    def retransmissions(self) -> int:
        """TCP segments retransmitted on the way to the next worker."""
        return tcp_retransmissions(self.next_sock)

    @property
    def tcp_congestion(self) -> str | None:
        """The congestion control of the connections to both neighbours."""
        return congestion_control(self.next_sock, self.prev_sock)

    def close(self):
        for s in (self.next_sock, self.prev_sock, self.listener):
            if s is not None:
                s.close()
