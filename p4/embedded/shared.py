"""The shared allocation's part of ``qaina.p4`` (ATP-style best-effort sharing).

A job of the shared allocation has no slots of its own: a chunk ``(job_id, seq)``
claims a free copy of the shared region or joins the copy that holds it; anything
else goes unsummed to the job's fallback host (the upstream). Read it next to the
``shared`` branch of ``MyIngress.apply``. ``Pipeline`` takes these methods in;
the state (registers, counters, ``_owner``) and the steps both allocations share
(``_add``, ``_to_upstream``, ``_result_to_all``, ...) are the pipeline's own.
"""

from __future__ import annotations

from ..constants import Drop
from ..header import FALLBACK_PARTIAL, FLAG_FALLBACK, FLAG_FLUSH, FLAG_RETX, QAINA_AT

#: the worker index of a member tuple for a result from the job's upper aggregator
UPPER = -2
_FLAGS, _EXP, _WORKER = QAINA_AT["flags"], QAINA_AT["exp"], QAINA_AT["worker"]


def count_packet(cells, cell: int, length: int):
    """One packet of ``length`` bytes in counter cell ``cell`` (packets, then bytes)."""
    cells[cell] += 1
    cells[cell + 1] += length


class SharedPool:
    """The register updates of a shared job's contribution, flush and release."""

    def _aggregate_shared(self, buf, payload, length: int, in_port: int, member: tuple,
                          h: tuple, copy: int):
        """The register part of ``MyIngress.apply`` for a shared job: the copy
        ``copy`` is claimed, joined, given up or bypassed (a collision)."""
        worker, _, cell, n_workers, _, _, group, up, _ = member
        flags, exp = h[12], h[15]
        seen, count = self._seen[copy], self._count[copy]
        mine = self._owner[copy] == h[10] and self.agg_seq[copy] == h[16] and seen != 0
        if worker == UPPER and flags & FLAG_FLUSH:
            self._flush_shared(buf, payload, length, copy, mine, seen, count, n_workers,
                               cell, up)
        elif worker == UPPER:
            self._release_shared(buf, payload, copy, mine, count, exp, cell, group)
        else:
            self._contribute_shared(buf, payload, length, in_port, h, copy, mine, member)

    def _flush_shared(self, buf, payload, length: int, copy: int, mine: bool, seen: int,
                      count: int, n_workers: int, cell: int, up: tuple):
        """The fallback host holds singles of the workers in payload word 0: if this
        copy holds the chunk's other workers exactly, their partial sum goes to the
        host and the use is given up (closed); else STALE_RESULT."""
        have = int(payload[0])
        if not (mine and count != 0 and not seen & have
                and seen | have == (1 << n_workers) - 1):
            self._drop(Drop.STALE_RESULT, length)
            return
        payload[:] = self._rows[copy]
        buf[_EXP] = self._exp[copy] & 0xFF
        self._seen[copy] = 0
        self._count[copy] = 0
        count_packet(self.cells["MyIngress.slots_closed"], cell, length)
        buf[_FLAGS] = 0
        buf[_WORKER] = FALLBACK_PARTIAL
        self._to_upstream(buf, up)

    def _release_shared(self, buf, payload, copy: int, mine: bool, count: int, exp: int,
                        cell: int, group: int):
        """The fallback host's result: it releases the copy that holds the chunk's
        sum; for a chunk no copy holds, it only goes down."""
        if mine and count == 0 and not self.agg_final[copy]:
            self._rows[copy][:] = payload
            self._exp[copy] = exp
            self.agg_final[copy] = 1
        self._result_to_all(buf, cell, group)

    def _contribute_shared(self, buf, payload, length: int, in_port: int, h: tuple,
                           copy: int, mine: bool, member: tuple):
        """A worker's contribution to the chunk this copy holds, or a claim of a free
        copy, or (the copy held by another use) a single to the fallback host."""
        worker, _, cell, n_workers, _, _, _, up, _ = member
        flags, exp = h[12], h[15]
        seen, count, final = self._seen[copy], self._count[copy], self.agg_final[copy]
        cells = self.cells
        mask, retx = 1 << worker, flags & FLAG_RETX
        if mine and not seen & mask:  # another worker of the use that holds the copy
            self._seen[copy] = seen | mask
            count_packet(cells["MyIngress.agg_packets"], cell, length)
            exp = self._add(self._rows[copy], payload, copy, exp)
            count = (count + 1) & 0xFF  # bit<8>
            if count != n_workers:
                self._count[copy] = count
                return
            self._shared_complete(buf, payload, length, copy, cell, exp, up)
        elif mine and count != 0:
            if not retx:
                self._drop(Drop.DUPLICATE, length)
                return
            # A worker of the open use timed out: the use is given up (it leaves
            # the switch: closed), its contributions go to the fallback host from now on.
            self._seen[copy] = 0
            self._count[copy] = 0
            count_packet(cells["MyIngress.slots_closed"], cell, length)
            buf[_FLAGS] = FLAG_RETX
            self._single_to_fallback(buf, up)
        elif mine:  # complete: answer once the result is in, else send the sum again
            payload[:] = self._rows[copy]
            buf[_EXP] = self._exp[copy] & 0xFF
            if not final:
                buf[_FLAGS] = FLAG_RETX
                self._partial_to_upstream(buf, up)
            else:
                self._result_to_sender(buf, in_port, cell, self._exp[copy], length)
        elif count == 0 and (seen == 0 or final == 1) and not retx:  # free: claim it
            self._claim_shared(buf, payload, length, copy, h, member)
        else:  # collision: the copy is another use's
            count_packet(cells["MyIngress.fallback_packets"], cell, length)
            self._single_to_fallback(buf, up)

    def _claim_shared(self, buf, payload, length: int, copy: int, h: tuple, member: tuple):
        """A free copy: the chunk ``(job, seq)`` claims it with this contribution."""
        worker, _, cell, n_workers, _, _, _, up, _ = member
        exp = h[15]
        self._owner[copy] = h[10]
        self.agg_seq[copy] = h[16]
        self._seen[copy] = 1 << worker
        self._rows[copy][:] = payload
        self._exp[copy] = exp
        self.agg_final[copy] = 0
        count_packet(self.cells["MyIngress.slots_opened"], cell, length)
        count_packet(self.cells["MyIngress.agg_packets"], cell, length)
        if n_workers != 1:
            self._count[copy] = 1
            return
        self._shared_complete(buf, payload, length, copy, cell, exp, up)

    def _shared_complete(self, buf, payload, length: int, copy: int, cell: int, exp: int,
                         up: tuple):
        """A shared use is complete: its sum goes to the fallback host, and the copy
        stays held (``agg_final`` 0) until the host's result comes back."""
        self._count[copy] = 0
        count_packet(self.cells["MyIngress.slots_closed"], cell, length)
        payload[:] = self._rows[copy]
        buf[_EXP] = exp & 0xFF
        buf[_FLAGS] = 0
        self._partial_to_upstream(buf, up)

    def _single_to_fallback(self, buf, up: tuple):
        """``single_to_fallback``: a worker's contribution out to the job's fallback
        host, its worker index kept, ``FLAG_FALLBACK`` added."""
        buf[_FLAGS] |= FLAG_FALLBACK
        self._to_upstream(buf, up)
