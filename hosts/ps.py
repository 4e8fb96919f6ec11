"""Parameter server: the host-based baseline in which one host sums.

Every worker of a job keeps one TCP connection to the job's server, a host of its
own (as in the PS baselines of SwitchML and ATP). For each all-reduce a worker sends
its whole vector and receives the reduction; the server reduces the vectors segment
by segment as they arrive and sends every reduced segment back to all workers at
once, so its link carries n vectors in and n out while each worker's carries one
each way. The reduction is the switch's: wrapping 32-bit addition of packed words
(or float addition for fp32, the maximum for the scale exponents).

Run the server as ``python -m qaina_bench.hosts.ps PORT WORKERS [CONGESTION]``; it
serves until every worker has closed its connection. Every connection uses the TCP
congestion control CONGESTION (the run's ``--tcp-cc``; by default the host's).
"""

from __future__ import annotations

import signal
import socket
import struct
import sys
import threading
import time

import numpy as np

from .ring import congestion_control, connect_until, tcp_retransmissions, tcp_socket

PS_PORT = 20803
SEGMENT = 64 * 1024  # bytes the server reduces at a time
OPS = {"add": np.add, "max": np.maximum}
_OP_NAMES = {np.add: "add", np.maximum: "max"}
# Request header: vector bytes, op name, dtype string (both 8 bytes, space padded).
_REQUEST = struct.Struct("!Q8s8s")


class PSError(RuntimeError):
    """The server could not be reached, or a worker or the server broke off."""


def _recv_exact(sock: socket.socket, view: memoryview, what: str):
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:])
        if n == 0:
            raise PSError(f"{what} closed the connection")
        got += n


class PSClient:
    """A worker's connection to its job's parameter server (``all_reduce`` like
    ``Ring.all_reduce``) using the TCP congestion control ``congestion``."""

    def __init__(self, worker: int, server: tuple[str, int], congestion: str | None = None):
        self.worker = worker
        self.congestion = congestion
        self.server = (str(server[0]), int(server[1]))
        self.sock: socket.socket | None = None
        self.bytes_sent = 0
        self.bytes_received = 0

    def connect(self, timeout: float = 60.0):
        self.sock = connect_until(self.server, time.monotonic() + timeout, PSError,
                                  "the parameter server", self.congestion)
        self.sock.settimeout(None)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.sendall(struct.pack("!I", self.worker))

    def all_reduce(self, data: np.ndarray, op) -> np.ndarray:
        """Reduce ``data`` in place over the job's workers at the server."""
        data = np.ascontiguousarray(data)
        header = _REQUEST.pack(data.nbytes, _OP_NAMES[op].encode().ljust(8),
                               data.dtype.str.encode().ljust(8))
        error = []

        def send():
            try:
                self.sock.sendall(header)
                self.sock.sendall(data.tobytes())
            except OSError as exc:
                error.append(exc)

        sender = threading.Thread(target=send)
        sender.start()
        out = bytearray(data.nbytes)
        try:
            _recv_exact(self.sock, memoryview(out), "the parameter server")
        finally:
            sender.join()
        if error:
            raise PSError(f"sending to the parameter server failed: {error[0]}")
        self.bytes_sent += _REQUEST.size + data.nbytes
        self.bytes_received += data.nbytes
        data[...] = np.frombuffer(out, dtype=data.dtype).reshape(data.shape)
        return data

    @property
    def retransmissions(self) -> int:
        """TCP segments retransmitted on the way to the server."""
        return tcp_retransmissions(self.sock)

    @property
    def tcp_congestion(self) -> str | None:
        """The congestion control of the connection to the server."""
        return congestion_control(self.sock)

    def close(self):
        if self.sock is not None:
            self.sock.close()


class ParameterServer:
    """The server of one job: accepts ``workers`` connections, then reduces every
    request they make together until they close; every connection uses the TCP
    congestion control ``congestion`` (None: the host's default)."""

    def __init__(self, port: int, workers: int, host: str = "0.0.0.0",
                 congestion: str | None = None):
        self.workers = workers
        self.listener = tcp_socket(congestion, PSError)  # accepted sockets inherit it
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind((host, port))
        self.listener.listen(workers)
        self.conns: list[socket.socket | None] = [None] * workers
        self.reductions = 0

    def accept(self, timeout: float = 120.0):
        self.listener.settimeout(timeout)
        for _ in range(self.workers):
            try:
                conn, _ = self.listener.accept()
            except socket.timeout:
                raise PSError(f"only {sum(c is not None for c in self.conns)} of "
                              f"{self.workers} workers connected within {timeout:.0f} s") from None
            conn.settimeout(None)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            index = struct.unpack("!I", self._read(conn, 4, "a worker"))[0]
            if index >= self.workers or self.conns[index] is not None:
                conn.close()
                raise PSError(f"a worker announced index {index} (taken or >= {self.workers})")
            self.conns[index] = conn

    @staticmethod
    def _read(conn, size: int, what: str) -> bytes:
        buf = bytearray(size)
        _recv_exact(conn, memoryview(buf), what)
        return bytes(buf)

    def serve(self):
        """Reduce requests until every worker has closed its connection."""
        while True:
            first = self.conns[0].recv(_REQUEST.size, socket.MSG_PEEK)
            if not first:
                return
            requests = [_REQUEST.unpack(self._read(c, _REQUEST.size, f"worker {k}"))
                        for k, c in enumerate(self.conns)]
            if len(set(requests)) != 1:
                raise PSError(f"the workers asked for different reductions: {requests}")
            size, op, dtype = requests[0]
            self._reduce(size, OPS[op.decode().strip()], np.dtype(dtype.decode().strip()))
            self.reductions += 1

    def _reduce(self, size: int, op, dtype: np.dtype):
        step = max(dtype.itemsize, SEGMENT // dtype.itemsize * dtype.itemsize)
        for start in range(0, size, step):
            length = min(step, size - start)
            total = None
            for k, conn in enumerate(self.conns):
                part = np.frombuffer(self._read(conn, length, f"worker {k}"), dtype=dtype)
                total = part.copy() if total is None else op(total, part, out=total)
            out = total.tobytes()
            for conn in self.conns:
                conn.sendall(out)

    def close(self):
        for c in self.conns + [self.listener]:
            if c is not None:
                c.close()


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        port, workers = int(argv[0]), int(argv[1])
        congestion = argv[2] if len(argv) == 3 else None
        if not 1 <= workers <= 32 or not 0 < port < 65536 or len(argv) > 3:
            raise ValueError
    except (IndexError, ValueError):
        print("usage: python -m qaina_bench.hosts.ps PORT WORKERS (1..32) [CONGESTION]",
              file=sys.stderr)
        return 2
    try:
        server = ParameterServer(port, workers, congestion=congestion)
    except (PSError, OSError) as exc:
        print(f"parameter server: {exc}", file=sys.stderr)
        return 1
    try:
        server.accept()
        tcp = congestion_control(*server.conns)
        server.serve()
    except (PSError, OSError) as exc:
        print(f"parameter server: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    finally:
        server.close()
    print(f"parameter server: {server.reductions} reductions for {workers} workers "
          f"(TCP congestion control {tcp})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
