"""The embedded switch's fast path for what a worker sends: a window of contributions.

A burst read from one port that is one member's first contributions to distinct
slots of its job is applied with numpy at once. Packets to different slots touch
disjoint register cells, so this leaves the registers, counters and results that the
per-packet path (``Pipeline._process_frames``, the reference) leaves;
``tests/test_pipeline_burst.py`` checks it frame for frame. Any other burst is left
untouched for the per-packet path.
"""

from __future__ import annotations

import itertools

import numpy as np

from ..constants import RESULT_TTL
from ..header import (ETH_DST, ETH_SRC, ETH_TYPE, FLAG_RESULT, IP_DST, IP_FLAGS_FRAG,
                      IP_PROTO, IP_SRC, IP_TOTAL_LEN, IP_TTL, IP_VIHL, PAYLOAD_OFFSET,
                      QAINA_AT, QAINA_OFFSET, UDP_CSUM, UDP_DPORT)
from .parser import ETHERTYPE_IPV4, HEADERS
from .replication import BLOCK_MIN

#: bursts of at least this many frames are first tried as a whole
BURST_MIN = 32
_SLOT = slice(QAINA_AT["slot"], QAINA_AT["slot"] + 2)
_VER, _EXP, _FLAGS = QAINA_AT["ver"], QAINA_AT["exp"], QAINA_AT["flags"]
_CHECKED = slice(ETH_TYPE, _EXP)  # what the checks read, but for the slot and exp


def _shared_mask() -> np.ndarray:
    """Bits of the checked bytes that every frame of a burst run as a whole must have
    in common: everything the parser and the ingress checks read, but the slot, the
    low bit of ver and exp (which are per packet)."""
    mask = np.zeros(_CHECKED.stop - _CHECKED.start, dtype=np.uint8)
    for offset, size, bits in ((ETH_TYPE, 2, 0xFF), (IP_VIHL, 1, 0x0F), (IP_TOTAL_LEN, 2, 0xFF),
                               (IP_FLAGS_FRAG, 1, 0x3F), (IP_FLAGS_FRAG + 1, 1, 0xFF),
                               (IP_PROTO, 1, 0xFF), (IP_SRC.start, 8, 0xFF),  # and IP_DST
                               (UDP_DPORT, 4, 0xFF),  # and the UDP length
                               (QAINA_OFFSET, 3, 0xFF),  # job_id, worker
                               (_FLAGS, 1, FLAG_RESULT), (_VER, 1, 0xFE)):  # ver > 1
        mask[offset - ETH_TYPE:offset - ETH_TYPE + size] = bits
    return mask


_SHARED_MASK = _shared_mask()


def count_packets(cells, cell: int, lengths, which: np.ndarray | None = None):
    """Count the packets of ``lengths`` (those where ``which`` is true, if given)."""
    if which is None:
        cells[cell] += len(lengths)
        cells[cell + 1] += sum(lengths)
    elif which.any():
        which = which.tolist()
        cells[cell] += sum(which)
        cells[cell + 1] += sum(itertools.compress(lengths, which))


def window_member(p, in_port: int, slots, lengths, frames: np.ndarray):
    """``(member, slot ids)`` if the burst is one member's first contributions to
    distinct slots that every check of ``qaina.p4`` admits, else None."""
    k = len(lengths)
    if min(lengths) < p.frame_len:
        return None
    checked = frames[:k, _CHECKED] & _SHARED_MASK
    if not (checked == checked[0]).all():
        return None
    # What holds for the first frame holds for all of them; slots are checked below.
    h = HEADERS.unpack_from(slots[0][0], ETH_TYPE)
    if h[0] != ETHERTYPE_IPV4 or h[7] not in p.aggregator:
        return None
    member = p.check(in_port, h)
    if isinstance(member, int):  # a drop reason
        return None
    first_slot, end_slot = member[4], member[5]
    slot_ids = frames[:k, _SLOT].view(">u2")[:, 0].astype(np.intp)
    increasing = (np.diff(slot_ids) > 0).all()  # a window in order: distinct slots
    lowest, highest = ((slot_ids[0], slot_ids[-1]) if increasing
                       else (slot_ids.min(), slot_ids.max()))
    if (lowest < first_slot or highest >= end_slot
            or not increasing and len(np.unique(slot_ids)) != k):
        return None
    return member, slot_ids


def apply_window(p, in_port: int, slots, lengths, frames: np.ndarray) -> bool:
    """Apply the burst with numpy if it is one member's window (see the module
    docstring); returns False, having changed nothing, for any other burst."""
    found = window_member(p, in_port, slots, lengths, frames)
    if found is None:
        return False
    (worker, _, cell, n_workers, _, _, group), slot_ids = found
    k = len(lengths)
    ver_pool = frames[:k, _VER].astype(np.intp) * p.pool_slots
    copies = slot_ids + ver_pool
    mask = 1 << worker
    seen = p.agg_seen[copies]
    if (seen & mask).any():
        return False
    # First contributions of this worker to these uses of the slots.
    p.agg_seen[copies] = seen | mask
    p.agg_seen[slot_ids + (p.pool_slots - ver_pool)] &= ~mask & 0xFFFFFFFF  # shadows
    count = p.agg_count[copies]
    opened = count == 0
    payloads = frames[:k, PAYLOAD_OFFSET:p.frame_len].view(">u4")
    if opened.all():
        p.agg_sum[copies] = payloads
    elif not opened.any():
        p.agg_sum[copies] += payloads
    else:
        p.agg_sum[copies[opened]] = payloads[opened]
        added = ~opened
        p.agg_sum[copies[added]] += payloads[added]
    exps = frames[:k, _EXP].view(np.int8)
    exps = np.where(opened, exps, np.maximum(p.agg_exp[copies], exps))
    p.agg_exp[copies] = exps
    count += 1
    closed = count == n_workers
    p.agg_count[copies] = np.where(closed, 0, count)
    count_packets(p.cells["MyIngress.agg_packets"], cell, lengths)
    count_packets(p.cells["MyIngress.slots_opened"], cell, lengths, opened)
    if closed.any():
        count_packets(p.cells["MyIngress.slots_closed"], cell, lengths, closed)
        _results_to_all(p, slots, frames, np.flatnonzero(closed), copies, exps, cell, group)
    return True


def _results_to_all(p, slots, frames: np.ndarray, done: np.ndarray, copies, exps,
                    cell: int, group: int):
    """``result_to_all`` for the completed slots ``done`` of the burst, then the PRE."""
    k = len(copies)
    if len(done) == k:  # every packet completed its slot: work in place
        results = frames[:k, :p.frame_len]
    else:
        results, copies, exps = frames[done, :p.frame_len], copies[done], exps[done]
    results[:, PAYLOAD_OFFSET:].view(">u4")[...] = p.agg_sum[copies]
    results[:, _EXP] = exps.view(np.uint8)
    results[:, _FLAGS] = FLAG_RESULT
    results[:, ETH_SRC] = results[:, ETH_DST]
    results[:, IP_SRC] = results[:, IP_DST]
    results[:, IP_TTL] = RESULT_TTL
    results[:, UDP_CSUM] = 0
    if len(done) < k:
        frames[done, :p.frame_len] = results  # fancy indexing copied them
    pre = p.pre
    replicas, block = pre.plan(group)
    if not replicas:
        return
    if len(done) >= BLOCK_MIN and block is not None:
        pre.count(cell, len(replicas) * len(done))
        pre.multicast_block(results, block)
    else:
        pre.pending.extend((slots[i][0], cell, group) for i in done.tolist())
