"""Overload control of the embedded switch: early discard of whole slot uses.

A hardware switch aggregates at line rate; this one runs on a CPU and can be offered
more than it processes. Left alone, the kernel then drops random frames from a
port's full receive ring: every lost contribution strands the slot use it belonged
to, the other workers' contributions to it are wasted work, and the switch spends
its time on slots that can no longer complete (receive livelock). Like early packet
discard in ATM switches (Romanow and Floyd, 1995), which drop whole packets rather
than random cells, the switch sheds whole slot uses instead:

* a port is **overloaded** while more than ``HIGH`` frames wait in its receive ring
  behind the burst it reads, until fewer than ``LOW`` do (``Port.overloaded``);
* while it is, a contribution it brings that would **open** a slot use (its copy's
  count is 0) is discarded, and the copy is marked: the other workers'
  contributions to that use are discarded too, wherever they arrive, until every
  worker's was (then the mark goes). Contributions to uses already open are applied:
  they finish work the switch has started. Retransmissions it would answer are
  discarded while the port is overloaded;
* a marked copy meeting a contribution of a worker already discarded there (a
  retransmission, or the next use) drops its mark: that use is over.

Discarded contributions count under the drop reason ``SHED`` (``MyIngress.drops``
cell 14, embedded switch only); a worker retransmits them like any loss. None of
this changes what the P4 program does with the packets it applies: an idle switch
never sheds, and the conformance suite sends single packets.
"""

from __future__ import annotations

import numpy as np

HIGH = 512  # frames waiting in a port's receive ring behind a burst: overloaded
LOW = 128  # ... fewer than this: not any more


class SlotShedder:
    """Which slot copies are being discarded, and which workers' contributions to
    them were (one bit per worker, as ``agg_seen``)."""

    def __init__(self, copies: int):
        self.shed = np.zeros(copies, dtype=np.uint32)  # workers discarded per copy
        self.marked = 0  # copies with a mark

    def discard(self, copies: np.ndarray, mask: int, opening: np.ndarray, n_workers: int,
                overloaded: bool = False) -> np.ndarray:
        """Which of one worker's contributions (``mask``: its bit) to distinct
        ``copies`` to discard; ``opening``: those whose copy's count is 0;
        ``overloaded``: the port they came from is."""
        if not self.marked and not overloaded:
            return np.zeros(len(copies), dtype=bool)
        shed = self.shed[copies]
        stale = (shed & mask) != 0  # this worker's contribution was shed there before
        marked = (shed != 0) & ~stale
        out = marked | (opening & overloaded)
        if out.any() or stale.any():
            full = (1 << n_workers) - 1
            shed = np.where(stale, 0, shed)
            shed = np.where(out, shed | mask, shed)
            shed = np.where(shed == full, 0, shed)  # every worker's went: the use is over
            self.shed[copies] = shed
            self.marked = int(np.count_nonzero(self.shed))
        return out

    def discard_one(self, copy: int, mask: int, opening: bool, n_workers: int) -> bool:
        """``discard`` for a single contribution."""
        return bool(self.discard(np.array([copy]), mask, np.array([opening]), n_workers)[0])
