"""The embedded switch's fast path for what a worker sends: a window of contributions.

A burst read from one port that is one member's contributions to distinct slots of
its job is applied with numpy at once: first contributions are summed, duplicates
dropped, retransmissions of completed uses answered in their turn. Packets to
different slots touch disjoint register cells, so this leaves the registers,
counters and results that the per-packet path (``Pipeline._process_frames``, the
reference) leaves; ``tests/test_pipeline_burst.py`` checks it frame for frame. A
burst whose slots are not in increasing order (a window that wraps to the next use
of its slots, or a duplicate) is applied piece by piece, each piece a window. Any
other burst is left untouched for the per-packet path.

Overload: ``take_burst`` with a shed level drops the contributions of whole slot
uses before anything is spent on them (``shed_mask``), so that a switch offered
more than it can aggregate keeps aggregating at its peak instead of losing random
frames from its full receive rings.
"""

from __future__ import annotations

import itertools

import numpy as np

from ..constants import RESULT_TTL, Drop
from ..header import (ETH_DST, ETH_SRC, ETH_TYPE, FLAG_RESULT, IP_DST, IP_FLAGS_FRAG,
                      IP_PROTO, IP_SRC, IP_TOTAL_LEN, IP_TTL, IP_VIHL, PAYLOAD_OFFSET,
                      QAINA_AT, QAINA_OFFSET, UDP_CSUM, UDP_DPORT)
from .parser import ETHERTYPE_IPV4, HEADERS
from .replication import BLOCK_MIN

#: bursts of at least this many frames are first tried as a whole
BURST_MIN = 4
_SLOT = slice(QAINA_AT["slot"], QAINA_AT["slot"] + 2)
_JOB = slice(QAINA_AT["job_id"], QAINA_AT["job_id"] + 2)
_SEQ = slice(QAINA_AT["seq"], QAINA_AT["seq"] + 4)
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
    found = burst_member(p, in_port, slots, lengths, frames)
    if found is None:
        return None
    slot_ids = found[1]
    if not (np.diff(slot_ids) > 0).all() and len(np.unique(slot_ids)) != len(slot_ids):
        return None
    return found


def burst_member(p, in_port: int, slots, lengths, frames: np.ndarray):
    """``(member, slot ids)`` if the burst is one member's contributions to slots of
    its job that every check of ``qaina.p4`` admits, else None."""
    k = len(lengths)
    if min(lengths) < p.frame_len:
        return None
    checked = frames[:k, _CHECKED] & _SHARED_MASK
    if not (checked == checked[0]).all():
        return None
    # What holds for the first frame holds for all of them; slots are checked below.
    h = HEADERS.unpack_from(slots[0][0], ETH_TYPE)
    if h[0] != ETHERTYPE_IPV4 or p.source(in_port, h[6]) is None or h[7] not in p.aggregator:
        return None
    member = p.check(in_port, h)
    if isinstance(member, int) or member[7] is not None or member[8]:
        return None  # a drop reason; two levels; the shared allocation
    first_slot, end_slot = member[4], member[5]
    slot_ids = frames[:k, _SLOT].view(">u2")[:, 0].astype(np.intp)
    if slot_ids.min() < first_slot or slot_ids.max() >= end_slot:
        return None
    return member, slot_ids


def take_burst(p, in_port: int, slots, lengths, frames: np.ndarray, level: int = 0,
               shedding: bool = False) -> bool:
    """Apply a burst of one member's contributions as windows: pieces of it whose
    slots increase, in order; ``shedding`` (the switch is overloaded, or uses are
    still half shed), first shed whole slot uses at shed level ``level``
    (``shed_mask``). Returns False, having changed nothing, for any other burst."""
    found = burst_member(p, in_port, slots, lengths, frames)
    if found is None:
        return False
    member, slot_ids = found
    k = len(lengths)
    bounds = [0, *(np.flatnonzero(slot_ids[1:] <= slot_ids[:-1]) + 1).tolist(), k]
    for a, b in zip(bounds, bounds[1:]):
        runs = [(a, b)]
        if shedding:
            shed = shed_mask(p, member, slot_ids[a:b], frames[a:b], level)
            if shed is not None:
                shed_count = int(np.count_nonzero(shed))
                p.shed_packets += shed_count
                runs = [] if shed_count == b - a else [(a + x, a + y) for x, y in _runs(~shed)]
        for x, y in runs:
            if p.pre.pending:  # results leave in the order of the frames that caused them
                p.pre.flush()
            if y - x < BURST_MIN:
                p._process_frames(in_port, slots[x:y], lengths[x:y])
            else:
                apply_window(p, in_port, slots[x:y], lengths[x:y], frames[x:y],
                             (member, slot_ids[x:y]))
    return True


def _runs(keep: np.ndarray) -> list[tuple[int, int]]:
    """The runs of True in ``keep`` as ``(start, stop)``."""
    edges = (np.flatnonzero(keep[1:] != keep[:-1]) + 1).tolist()
    edges = [0] * bool(keep[0]) + edges + [len(keep)] * bool(keep[-1])
    return list(zip(edges[0::2], edges[1::2]))


SHED_FULL = 1 << 16  # a shed level of SHED_FULL sheds every use not opened yet


def shed_mask(p, member: tuple, slot_ids: np.ndarray, frames: np.ndarray,
              level: int) -> np.ndarray | None:
    """Which contributions of one member's window (distinct slots) to shed at shed
    level ``level`` (1..SHED_FULL): whole slot uses, never part of one.

    * A use a contribution has opened (its count above 0) takes every later one:
      nothing is stranded half aggregated.
    * A use whose first arriving contribution was shed sheds the others too
      (``p.shed_held``: the workers shed from the copy's current use); once all n
      are shed the use is as if never sent, and the workers' retransmissions start
      it afresh. A worker shed before that sends again (a retransmission, or the
      sender lost one of the others): the use is judged afresh.
    * The uses nobody has touched yet are the window's to decide (none at level
      0, when the switch is no longer overloaded): all shed or all
      kept, so that the kept ones stay one window; over many windows the share
      shed is ``level / SHED_FULL`` (``p.shed_due``: frames owed to shedding).
    * A retransmission of a completed use (its result is answered one by one) is
      shed at a level above 0: the worker sends it again.

    None where nothing is shed. The common case (no use of the window half shed)
    takes a short way with the same outcome.
    """
    worker, n_workers = member[0], member[3]
    bit = 1 << worker
    copies = slot_ids + frames[:, _VER].astype(np.intp) * p.pool_slots
    ours = p.agg_owner[copies] == int(frames[0, _JOB].view(">u2")[0])  # else: not begun
    opened = p.agg_count[copies] != 0
    opened &= ours
    seen = (p.agg_seen[copies] & bit) != 0
    seen &= ours
    fresh = ~(opened | seen)
    was = p.shed_held[copies]
    if not was.any():  # no use of the window half shed: the fresh ones are undecided
        shed = None
        count = int(np.count_nonzero(fresh))
        if count:
            p.shed_due += count * level / SHED_FULL
            if p.shed_due >= count / 2:
                p.shed_due -= count
                shed = fresh
                if n_workers > 1:
                    p.shed_held[copies[fresh]] = bit
                    p.shed_pending += count
    else:
        held = np.where((was & bit) != 0, 0, was)  # shed before: judged afresh
        shed = fresh & (held != 0)
        undecided = fresh & (held == 0)
        count = int(np.count_nonzero(undecided))
        if count:
            p.shed_due += count * level / SHED_FULL
            if p.shed_due >= count / 2:
                p.shed_due -= count
                shed |= undecided
        held = np.where(shed, held | bit, held)
        held[held == (1 << n_workers) - 1] = 0
        p.shed_held[copies[fresh]] = held[fresh]
        p.shed_pending += (int(np.count_nonzero(held[fresh]))
                           - int(np.count_nonzero(was[fresh])))
        if not shed.any():
            shed = None
    if level:
        retx = seen & ~opened  # retransmissions of completed uses
        if retx.any():
            shed = retx if shed is None else shed | retx
    return shed


def apply_window(p, in_port: int, slots, lengths, frames: np.ndarray, found=None) -> bool:
    """Apply the burst with numpy if it is one member's window (see the module
    docstring); returns False, having changed nothing, for any other burst.
    ``found``: what ``window_member`` says of the burst, if known.

    Contributions the worker made before are duplicates (dropped) or retransmissions
    of completed uses (answered, in their turn).
    """
    if found is None:
        found = window_member(p, in_port, slots, lengths, frames)
        if found is None:
            return False
    member, slot_ids = found
    worker = member[0]
    k = len(lengths)
    copies = slot_ids + frames[:k, _VER].astype(np.intp) * p.pool_slots
    job_id = int(frames[0, _JOB].view(">u2")[0])
    stale = p.agg_owner[copies] != job_id  # another job's uses: this job's start afresh
    if stale.any():
        fresh = copies[stale]
        p.agg_seen[fresh] = 0
        p.agg_count[fresh] = 0
        p.agg_owner[fresh] = job_id
    mask = 1 << worker
    mine = (p.agg_seen[copies] & mask) != 0  # contributed to this use of the slot before
    if not mine.any():
        _contribute(p, slots, lengths, frames, None, copies, mask, member)
        return True
    count = p.agg_count[copies]
    apply = ~mine
    answer = mine & (count == 0)  # the result went out: a retransmission to answer
    _count_drops(p, lengths, Drop.DUPLICATE, mine & (count != 0))
    if not answer.any():
        if apply.any():
            _contribute(p, slots, lengths, frames, np.flatnonzero(apply), copies, mask, member)
        return True
    # Results and answers leave in the order of the frames that caused them.
    kind = np.where(apply, 1, 0) + np.where(answer, 2, 0)
    edges = np.flatnonzero(np.diff(kind)) + 1
    for start, stop in zip(np.r_[0, edges].tolist(), np.r_[edges, k].tolist()):
        if kind[start] == 1:
            _contribute(p, slots, lengths, frames, np.arange(start, stop), copies, mask, member)
        elif kind[start] == 2:
            for i in range(start, stop):
                buf, payload = slots[i]
                p._aggregate(buf, payload, lengths[i], in_port, member,
                             HEADERS.unpack_from(buf, ETH_TYPE))
    return True


def _count_drops(p, lengths, reason: int, which: np.ndarray):
    if which.any():
        count_packets(p.cells["MyIngress.drops"], 2 * reason, lengths, which)


def _contribute(p, slots, lengths, frames: np.ndarray, sel, copies: np.ndarray, mask: int,
                member: tuple):
    """First contributions of one worker (``mask``: its bit) to distinct slot uses:
    the frames ``sel`` of the burst (None: all of them)."""
    _, _, cell, n_workers, _, _, group, _, _ = member
    k = len(lengths)
    rows = slice(0, k) if sel is None else sel
    mine = copies if sel is None else copies[sel]
    ver_pool = mine - (mine % p.pool_slots)
    p.agg_seen[mine] |= mask
    p.agg_seen[mine % p.pool_slots + (p.pool_slots - ver_pool)] &= ~mask & 0xFFFFFFFF  # shadows
    count = p.agg_count[mine]
    opened = count == 0
    payloads = frames[rows, PAYLOAD_OFFSET:p.frame_len].view(">u4")
    if opened.any():  # a new use of the copy: its sequence number, no result from above
        new = mine[opened]
        p.agg_seq[new] = frames[rows, _SEQ].view(">u4")[opened, 0]
        p.agg_final[new] = 0
    if opened.all():
        p.agg_sum[mine] = payloads
    elif not opened.any():
        p.agg_sum[mine] += payloads
    else:
        p.agg_sum[mine[opened]] = payloads[opened]
        added = ~opened
        p.agg_sum[mine[added]] += payloads[added]
    exps = frames[rows, _EXP].view(np.int8)
    exps = np.where(opened, exps, np.maximum(p.agg_exp[mine], exps))
    p.agg_exp[mine] = exps
    count += 1
    closed = count == n_workers
    p.agg_count[mine] = np.where(closed, 0, count)
    picked = lengths if sel is None else [lengths[i] for i in sel.tolist()]
    count_packets(p.cells["MyIngress.agg_packets"], cell, picked)
    count_packets(p.cells["MyIngress.slots_opened"], cell, picked, opened)
    if closed.any():
        count_packets(p.cells["MyIngress.slots_closed"], cell, picked, closed)
        if sel is None:
            _results_to_all(p, slots, frames, np.flatnonzero(closed), copies, exps, cell, group)
        else:
            all_exps = np.zeros(k, dtype=np.int8)
            all_exps[sel] = exps
            _results_to_all(p, slots, frames, sel[closed], copies, all_exps, cell, group)


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
