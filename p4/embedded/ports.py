"""The switch's ports: one AF_PACKET socket per interface, and the receive loop."""

from __future__ import annotations

import errno
import logging
import select
import socket

log = logging.getLogger("qaina.switch.ports")

ETH_P_ALL = 0x0003
SOL_PACKET = 263
PACKET_IGNORE_OUTGOING = 23  # linux/if_packet.h, Linux >= 4.20
SOCKET_BUFFER = 4 << 20
BURST = 64  # frames read from one port before looking at the others


class PortError(OSError):
    """An interface the switch was told to use cannot be opened."""


class Port:
    """A switch port bound to one network interface."""

    def __init__(self, number: int, ifname: str):
        self.number = number
        self.ifname = ifname
        try:
            sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        except PermissionError:
            raise PortError(f"port {number}: opening a raw socket needs root "
                            "(run the switch as root)") from None
        try:
            sock.bind((ifname, ETH_P_ALL))
        except OSError as exc:
            sock.close()
            raise PortError(f"port {number}: interface {ifname!r}: {exc.strerror}") from None
        sock.setsockopt(SOL_PACKET, PACKET_IGNORE_OUTGOING, 1)
        for opt, force in ((socket.SO_RCVBUF, 33), (socket.SO_SNDBUF, 32)):  # *BUFFORCE
            try:
                sock.setsockopt(socket.SOL_SOCKET, force, SOCKET_BUFFER)
            except OSError:
                sock.setsockopt(socket.SOL_SOCKET, opt, SOCKET_BUFFER)
        sock.setblocking(False)
        self.sock = sock
        self.rx_packets = 0
        self.tx_packets = 0
        self.tx_errors = 0

    def send(self, frame):
        try:
            self.sock.send(frame)
            self.tx_packets += 1
        except OSError as exc:  # ENOBUFS / EAGAIN: the interface queue is full
            self.tx_errors += 1
            if exc.errno not in (errno.ENOBUFS, errno.EAGAIN, errno.ENETDOWN, errno.ENXIO):
                raise

    def close(self):
        self.sock.close()


class PortSet:
    """All ports of one switch and the loop that feeds their frames to a pipeline."""

    def __init__(self, interfaces: dict[int, str]):
        self.ports: dict[int, Port] = {}
        try:
            for number, ifname in sorted(interfaces.items()):
                self.ports[number] = Port(number, ifname)
        except PortError:
            self.close()
            raise
        self._by_fd = {p.sock.fileno(): p for p in self.ports.values()}
        self.stopping = False

    def send(self, port: int, frame):
        """Transmit on ``port``; frames to ports the switch does not have are dropped."""
        p = self.ports.get(port)
        if p is not None:
            p.send(frame)

    def run(self, device):
        """Receive until ``stop()``; every frame goes to ``device.pipeline``."""
        poller = select.epoll()
        for fd in self._by_fd:
            poller.register(fd, select.EPOLLIN)
        try:
            while not self.stopping:
                for fd, _ in poller.poll(0.2):
                    self._drain(self._by_fd[fd], device)
        finally:
            poller.close()

    def _drain(self, port: Port, device):
        pipeline = device.pipeline
        if pipeline is None:  # no program yet: like BMv2 started with --no-p4
            buf = bytearray(2048)
            while True:
                try:
                    port.sock.recv_into(buf)
                except (BlockingIOError, InterruptedError):
                    return
        buf = pipeline.rx_frame
        recv_into = port.sock.recv_into
        process = pipeline.process
        number = port.number
        for _ in range(BURST):
            try:
                n = recv_into(buf)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno == errno.ENETDOWN:
                    return
                raise
            port.rx_packets += 1
            process(number, buf, n)

    def stop(self):
        self.stopping = True

    def close(self):
        for p in self.ports.values():
            p.close()

    def stats(self) -> dict:
        return {p.ifname: {"rx": p.rx_packets, "tx": p.tx_packets, "tx_errors": p.tx_errors}
                for p in self.ports.values()}
