"""The receive loop of a switch: all its ports, fed to its pipeline.

Overload: offered more than it can aggregate, a switch that let its receive rings
fill would lose random frames (the kernel drops what finds its ring full), each of
which strands a slot use, and would spend its time on what follows from that. The
receive loop instead watches how far its rings are behind (``Port.backlog``) and
sets a shed level (``Overload``) at which the pipeline drops the contributions of
whole slot uses before spending anything on them (``burst.shed_mask``), like a
queue that drops whole packets rather than cells.

Coalescing: where frames trickle in (shaped links deliver them one at a time), a
switch that woke for each would spend per frame what a burst costs per burst. After
a round whose longest read was shorter than ``burst.BURST_MIN`` frames, the loop
waits ``coalesce_s`` (``COALESCE_S``) before looking again, so that the next reads are bursts (as a
NIC moderates its interrupts); a frame waits at most that long. Rounds of longer
reads (unshaped links, overload) go on at once.
"""

from __future__ import annotations

import logging
import os
import select
import time

from .burst import BURST_MIN, SHED_FULL
from .ports import BURST, BURST_SHEDDING, RX_RING_FRAMES, Port, PortError

log = logging.getLogger("qaina.switch.ports")

#: seconds the receive loop waits after a round of short reads (coalescing, above)
#: unless the command line says (``--coalesce-us``): none by default (measured, it
#: did not lower the CPU per element consistently: ``docs/performance.md``);
#: ``QAINA_SWITCH_COALESCE=<microseconds>`` in the environment sets the default
_COALESCE_ENV = os.environ.get("QAINA_SWITCH_COALESCE", "0")
COALESCE_S = (int(_COALESCE_ENV) if _COALESCE_ENV.isdigit() else 0) / 1e6


class PortSet:
    """All ports of one switch and the loop that feeds their frames to a pipeline."""

    def __init__(self, interfaces: dict[int, str], rings: bool | None = None,
                 coalesce_s: float | None = None):
        if rings is None:  # QAINA_SWITCH_RINGS=0 selects the socket path
            rings = os.environ.get("QAINA_SWITCH_RINGS", "1") != "0"
        self.ports: dict[int, Port] = {}
        try:
            for number, ifname in sorted(interfaces.items()):
                self.ports[number] = Port(number, ifname, rings=rings)
        except PortError:
            self.close()
            raise
        self._by_fd = {p.sock.fileno(): p for p in self.ports.values()}
        self.overload = Overload()
        self.stopping = False
        self.coalesce_s = COALESCE_S if coalesce_s is None else coalesce_s
        self.coalesced = 0  # waits after rounds of short reads

    def send(self, port: int, frame):
        """Transmit on ``port``; frames to ports the switch does not have are dropped."""
        p = self.ports.get(port)
        if p is not None:
            p.send(frame)

    def port(self, number: int) -> Port | None:
        """Port ``number`` (``send``, ``send_block``), None if the switch has no such port."""
        return self.ports.get(number)

    def run(self, device):
        """Receive until ``stop()``; every frame goes to ``device.pipeline``.

        The frames the pipeline sends in answer to one round of ready ports are handed
        to the kernel together, one ``flush()`` per port. After each round the shed
        level follows how far the rings are behind (``Overload``).
        """
        poller = select.epoll()
        for fd in self._by_fd:
            poller.register(fd, select.EPOLLIN)
        ports = list(self.ports.values())
        by_fd = self._by_fd
        drain = self._drain
        overload = self.overload
        coalesce = self.coalesce_s
        waiting = False  # frames left in a transmit ring for want of socket buffer
        try:
            while not self.stopping:
                longest = 0
                for fd, events in poller.poll(0.001 if waiting else 0.2):
                    port = by_fd[fd]
                    if events & select.EPOLLERR:  # reported until read (a ring never is)
                        port.clear_error()
                    longest = max(longest, drain(port, device, overload,
                                                 overload.level_of(port.number)))
                waiting = False
                for p in ports:
                    if p.tx_queued and not self._flush(p):
                        waiting = True
                overload.update(time.monotonic())
                if coalesce and 0 < longest < BURST_MIN and not waiting:
                    time.sleep(coalesce)
                    self.coalesced += 1
        finally:
            poller.close()

    @staticmethod
    def _drain(port: Port, device, overload: Overload, level: int) -> int:
        """Read a burst from ``port`` into the pipeline; returns its frames."""
        most = BURST_SHEDDING if level else BURST
        slots, lengths, frames = port.receive(most)
        if not lengths:
            port.release()  # a read of frames all dropped (too long) holds its slots too
            return 0
        if level or len(lengths) == most:  # the ring may hold more
            overload.behind(port.number, port.backlog())
        try:
            pipeline = device.pipeline
            if pipeline is not None:  # no program yet: dropped, like BMv2 with --no-p4
                before = pipeline.shed_packets
                pipeline.process_burst(port.number, slots, lengths, frames, level)
                port.shed += pipeline.shed_packets - before
        finally:
            port.release()
        return len(lengths)

    @staticmethod
    def _flush(port: Port) -> bool:
        """``port.flush()``; an error the kernel gives is counted and logged, and the
        switch goes on (the frames stay queued for the next flush)."""
        try:
            return port.flush()
        except OSError as exc:
            port.tx_errors += 1
            if port.tx_errors <= 10:
                log.warning("port %d (%s): transmit failed: %s", port.number, port.ifname, exc)
            return True

    def stop(self):
        self.stopping = True

    def close(self):
        for p in self.ports.values():
            p.close()

    def stats(self) -> dict:
        return {p.ifname: {"rx": p.rx_packets, "rx_reads": p.rx_reads,
                           "rx_dropped": p.kernel_drops(), "shed": p.shed,
                           "rx_oversize": p.rx_oversize,
                           "rx_mode": p.rx_mode, "tx": p.tx_packets, "tx_calls": p.tx_calls,
                           "tx_errors": p.tx_errors, "tx_mode": p.tx_mode,
                           "link_errors": p.link_errors}
                for p in self.ports.values()}


class Overload:
    """The shed level of each port of a switch (0: none .. ``burst.SHED_FULL``: every
    slot use not opened yet), from how full its receive ring is.

    Every ``PERIOD`` seconds it looks at the most frames each ring held in that period
    (``Port.backlog``) and sets that port's level in proportion to how far that is
    past ``LOW``: none up to ``LOW``, everything from ``FULL`` on (where the kernel is
    about to drop at random and strand uses). The rings are let fill to a quarter
    before anything is shed: a switch that is behind reads long bursts, which cost
    it less per frame than the short ones it reads when it keeps up. A level follows
    its ring, with nothing kept from before: once a stall (the switch descheduled,
    say) is worked off, it sheds no more than the load needs. Each port sheds by its
    own ring: a port that a host floods with frames the pipeline drops anyway
    (another's, malformed) falls behind alone, and the workers' ports do not shed for
    it. Whole uses stay whole across ports at different levels (``burst.shed_mask``:
    a use one contribution opened takes the rest, one whose first was shed sheds the
    rest).
    """

    FULL = RX_RING_FRAMES * 7 // 8
    LOW = RX_RING_FRAMES // 4
    PERIOD = 0.002

    def __init__(self):
        self.levels: dict[int, int] = {}  # port -> its shed level, when above 0
        self.deepest: dict[int, int] = {}  # port -> the most frames its ring held
        self._next = 0.0
        self._said = -60.0  # when the log last said the switch sheds

    @property
    def level(self) -> int:
        """The highest level of any port."""
        return max(self.levels.values(), default=0)

    def level_of(self, port: int) -> int:
        return self.levels.get(port, 0)

    def behind(self, port: int, backlog: int):
        """Port ``port``'s ring held ``backlog`` frames (``Port.backlog``)."""
        if backlog > self.deepest.get(port, 0):
            self.deepest[port] = backlog

    def update(self, now: float):
        if now < self._next:
            return
        self._next = now + self.PERIOD
        deepest, self.deepest = self.deepest, {}
        shedding = bool(self.levels)
        span = self.FULL - self.LOW
        levels = {p: min(SHED_FULL, SHED_FULL * (d - self.LOW) // span)
                  for p, d in deepest.items()}
        self.levels = {p: v for p, v in levels.items() if v > 0}  # at or below LOW: 0
        if self.levels and not shedding and now - self._said >= 10:  # at most every 10 s
            self._said = now
            port = max(self.levels, key=self.levels.get)
            log.info("overloaded: port %d's receive ring held %d frames, shedding whole "
                     "slot uses", port, deepest[port])
