"""The packet replication engine and egress of ``qaina.p4`` in software.

A result leaves ingress with ``mcast_grp`` set; the PRE makes one copy per replica of
the group ``(egress port, instance)``, and ``MyEgress`` rewrites each copy for its
worker with ``result_rewrite`` (keyed by the instance: the worker's MAC, address
and index) and counts it in ``results_sent``. Results completed in one burst are
kept in ``pending`` and sent in completion order; a run of at least ``BLOCK_MIN``
results of one group is replicated with numpy and handed to each port as a block.
"""

from __future__ import annotations

import struct

import numpy as np

from ..header import ETH_DST, FRAME_LEN, IP_CSUM, IP_DST, IP_VIHL, QAINA_AT

#: results of one group completed in a row, from this many on, go out as one block
BLOCK_MIN = 16
# The IPv4 header words a result's checksum sums before its destination address
# (all but the checksum itself and dstAddr).
_REST_WORDS = np.array([1, 1, 1, 1, 1, 0, 1, 1, 0, 0], dtype=np.int64)
_WORKER = QAINA_AT["worker"]
_IPV4_WORDS = struct.Struct("!10H")


class PortTx:
    """Transmits on one port through ``tx(port, frame)``."""

    def __init__(self, tx, port: int):
        self.tx = tx
        self.port = port

    def send(self, frame):
        self.tx(self.port, frame)

    def send_block(self, frames: np.ndarray):
        """Send each row of ``frames`` (one frame per row)."""
        for frame in frames:
            self.tx(self.port, memoryview(frame))


def _ip_sum(ip: bytes) -> int:
    """The sum of the two 16-bit halves of an address (its part of a checksum)."""
    return (ip[0] << 8 | ip[1]) + (ip[2] << 8 | ip[3])


class Replication:
    """Multicast groups, the egress rewrites, and the results waiting to go out."""

    def __init__(self, port_tx, results_sent, frame_len: int = FRAME_LEN):
        """``port_tx(port)`` returns what transmits on ``port`` (``send(frame)``,
        ``send_block(frames)``) or None; ``results_sent`` is the flat memoryview of
        ``MyEgress.results_sent`` (packets, bytes per job index); ``frame_len`` is
        the length of a result (the pipeline's build)."""
        self.port_tx = port_tx
        self.frame_len = frame_len
        self.results_sent = results_sent
        #: multicast group id -> [(egress port, instance)], as P4Runtime wrote it
        self.groups: dict[int, list[tuple[int, int]]] = {}
        #: instance -> (MAC, address, worker) of MyEgress.result_rewrite's to_worker
        #: (None: NoAction); ``rewrite_default`` for an instance without an entry
        self.rewrites: dict[int, tuple | None] = {}
        self.rewrite_default: tuple | None = None
        #: results completed and not sent yet: (frame, job counter cell, group)
        self.pending: list[tuple] = []
        self._plans: dict[int, tuple] = {}
        self._stage = np.zeros((0, frame_len), dtype=np.uint8)  # results of one block
        self._stage_rows: list[memoryview] = []

    def count(self, cell: int, copies: int):
        c = self.results_sent
        c[cell] += copies
        c[cell + 1] += copies * self.frame_len

    # -- replicas ------------------------------------------------------------------------
    def plan(self, group: int) -> tuple:
        """``(replicas, block)``: a group's copies with the egress rewrites applied.

        Each replica is ``(send, mac, ip, worker, ip_sum)``; ``send`` is None for a
        port the switch lacks; ``mac`` is None for a copy egress leaves as ingress
        made it (instance 0, or ``result_rewrite`` runs NoAction for it). ``block`` is the same as
        arrays for ``multicast_block`` (None if a copy is left as ingress made it).
        """
        replicas = self.groups.get(group)
        if not replicas:
            return (), None
        cached = self._plans.get(group)
        if cached is not None and cached[1] is self.rewrites and cached[0] == replicas:
            return cached[2]
        plan, transmitters = [], []
        for port, instance in replicas:
            transmitter = self.port_tx(port)
            transmitters.append(transmitter)
            send = None if transmitter is None else transmitter.send
            target = instance and self.rewrites.get(instance, self.rewrite_default)
            if target:
                mac, ip, worker = target
                plan.append((send, mac, ip, worker, _ip_sum(ip)))
            else:
                plan.append((send, None, None, None, None))
        block = None
        if all(r[1] is not None for r in plan):
            n = len(plan)
            block = (transmitters,
                     np.frombuffer(b"".join(r[1] for r in plan), np.uint8).reshape(n, 1, 6),
                     np.frombuffer(b"".join(r[2] for r in plan), np.uint8).reshape(n, 1, 4),
                     np.array([r[3] for r in plan], dtype=np.uint8).reshape(n, 1),
                     np.array([r[4] for r in plan], dtype=np.int64).reshape(n, 1))
        result = tuple(plan), block
        self._plans[group] = (list(replicas), self.rewrites, result)
        return result

    # -- sending ---------------------------------------------------------------------
    def flush(self):
        """Multicast the pending results, in order; a run of at least ``BLOCK_MIN`` of
        one group as one block per port."""
        results = self.pending[:]
        self.pending.clear()
        n, i = len(results), 0
        while i < n:
            group = results[i][2]
            k = i + 1
            while k < n and results[k][2] == group:
                k += 1
            replicas, block = self.plan(group)
            if replicas:
                if k - i >= BLOCK_MIN and block is not None:
                    self.multicast_block(self._stage_results(results[i:k], len(replicas)),
                                         block)
                else:
                    for buf, cell, _ in results[i:k]:
                        self.multicast(buf, cell, replicas)
            i = k

    def _stage_results(self, results, copies: int) -> np.ndarray:
        """The frames of ``results`` as the rows of one array; counts the ``copies``
        of each that will be sent."""
        k = len(results)
        if len(self._stage) < k:
            self._stage = np.zeros((max(k, 64), self.frame_len), dtype=np.uint8)
            self._stage_rows = [memoryview(row) for row in self._stage]
        for row, (buf, cell, _) in zip(self._stage_rows, results):
            row[:] = buf[:self.frame_len]
            self.count(cell, copies)
        return self._stage[:k]

    def multicast(self, buf, cell: int, replicas):
        """Send the result in ``buf`` to every replica (egress: ``to_worker``)."""
        if any(r[1] is None for r in replicas):  # copies left as ingress made them
            mac, ip = bytes(buf[ETH_DST]), bytes(buf[IP_DST])
            sender = (mac, ip, buf[_WORKER], _ip_sum(ip))
        # Replicas differ only in destination MAC, address and worker: the IPv4
        # checksum is the sum of the rest plus the destination's two 16-bit halves.
        words = _IPV4_WORDS.unpack_from(buf, IP_VIHL)
        rest = sum(words) - words[5] - words[8] - words[9]
        frame = buf[:self.frame_len]
        for send, mac, ip, worker, ip_sum in replicas:
            if mac is None:
                mac, ip, worker, ip_sum = sender
            buf[ETH_DST] = mac
            buf[IP_DST] = ip
            buf[_WORKER] = worker
            c = rest + ip_sum
            c = (c & 0xFFFF) + (c >> 16)
            c = ~((c & 0xFFFF) + (c >> 16)) & 0xFFFF
            buf[IP_CSUM] = c >> 8
            buf[IP_CSUM + 1] = c & 0xFF
            if send is not None:
                send(frame)
        self.count(cell, len(replicas))

    @staticmethod
    def multicast_block(results: np.ndarray, block):
        """``multicast`` for many results of one group at once (the rows of
        ``results``, already counted): every copy built with numpy, and each port
        gets its copies as one block."""
        transmitters, macs, ips, workers, ip_sums = block
        count, k = len(transmitters), len(results)
        # The checksum as multicast folds it: for a sum s > 0 the folded one's
        # complement sum is (s - 1) % 0xFFFF + 1.
        sums = ip_sums + results[:, IP_VIHL:IP_DST.stop].view(">u2") @ _REST_WORDS
        checksums = (0xFFFE - (sums - 1) % 0xFFFF).astype(">u2")
        frames = np.empty((count, k, results.shape[1]), dtype=np.uint8)
        frames[...] = results
        frames[:, :, ETH_DST] = macs
        frames[:, :, IP_DST] = ips
        frames[:, :, _WORKER] = workers
        frames[:, :, IP_CSUM:IP_CSUM + 2] = checksums.view(np.uint8).reshape(count, k, 2)
        for transmitter, copies in zip(transmitters, frames):
            if transmitter is not None:
                transmitter.send_block(copies)
