"""The ``qaina.p4`` pipeline in software: parser, ingress, PRE, egress, deparser.

``Pipeline.process_burst(port, slots, lengths)`` runs received frames through the same
steps as ``qaina.p4`` on BMv2 and sends what they cause through ``tx(port, frame)``
(multicast copies through the port's ``send``/``send_block``, see ``Pipeline``);
``Pipeline.process(port, frame)`` does the same for one frame. State lives in the
objects the P4 program declares, named by its P4Info: tables (``Table``), registers
and counters (numpy arrays) and multicast groups. Table writes arrive from the
P4Runtime server (``runtime.py``) through ``Table``.

Frames are taken one by one, as the P4 program does; a burst that is one worker's
first contributions to distinct slots is applied at once with numpy, and a run of
results of one multicast group is replicated at once, with the same outcome.
"""

from __future__ import annotations

import itertools
import logging
import struct

import numpy as np

from ..header import (FLAG_RESULT, FLAG_RETX, IPV4_TOTAL_LEN, QAINA_OFFSET, QAINA_STRUCT,
                      QAINA_UDP_PORT, QAINA_WORDS, UDP_TOTAL_LEN, PAYLOAD_OFFSET, FRAME_LEN)
from ..constants import MAX_JOBS, MAX_WORKERS, RESULT_TTL, Drop
from ..p4info import ActionInfo, P4Info, TableInfo

log = logging.getLogger("qaina.switch")

#: IPv4 flags and fragment offset: a packet with MF set or an offset is a fragment
_FRAGMENT = 0x3FFF
NO_ACTION = "NoAction"
_MISS = object()

_IPV4_WORDS = struct.Struct("!10H")
_ADDR = struct.Struct("!I")
_CHECKSUM = struct.Struct("!H")
# Frame bytes 12 .. 53 (EtherType to the end of the QAINA header) as the fields the
# pipeline reads, the others skipped: etherType; version/ihl, totalLen, flags/fragOffset,
# ttl, protocol, srcAddr, dstAddr; UDP dstPort, length; every QAINA field.
_HEADERS = struct.Struct("!HBxHxxHBBxxIIxxHHxx" + QAINA_STRUCT.format.lstrip("!@=<>"))
assert 12 + _HEADERS.size == PAYLOAD_OFFSET
_QAINA_WORKER = QAINA_OFFSET + 2  # byte offsets of single QAINA fields in a frame
_QAINA_FLAGS = QAINA_OFFSET + 3
_QAINA_EXP = QAINA_OFFSET + 7

#: A frame slot is placed at this offset modulo 4 in its buffer so that the payload
#: words are 4-byte aligned.
SLOT_ALIGN_OFFSET = (-PAYLOAD_OFFSET) % 4
#: Results of one multicast group completed in a row within a burst, from this many
#: on, are replicated with numpy and handed to each port as one block.
BLOCK_MIN = 16
#: Bursts of at least this many frames are first tried as a whole with numpy
#: (``Pipeline._contribution_burst``).
BURST_MIN = 32


def _shared_mask() -> np.ndarray:
    """Bits of frame bytes 12 .. 49 (EtherType .. QAINA exp) that every frame of a burst
    run as a whole must have in common: everything the parser and the ingress checks
    read, but the slot, the low bit of ver and exp (which are per packet)."""
    mask = np.zeros(50 - 12, dtype=np.uint8)
    for offset, size, bits in ((12, 2, 0xFF),  # etherType
                               (14, 1, 0x0F),  # ihl
                               (16, 2, 0xFF),  # totalLen
                               (20, 1, 0x3F), (21, 1, 0xFF),  # MF, fragOffset
                               (23, 1, 0xFF),  # protocol
                               (26, 8, 0xFF),  # srcAddr, dstAddr
                               (36, 4, 0xFF),  # UDP dstPort, length
                               (QAINA_OFFSET, 3, 0xFF),  # job_id, worker
                               (_QAINA_FLAGS, 1, FLAG_RESULT),
                               (QAINA_OFFSET + 6, 1, 0xFE)):  # ver > 1
        mask[offset - 12:offset - 12 + size] = bits
    return mask


_SHARED_MASK = _shared_mask()
# The IPv4 header words a result's checksum sums before its destination address
# (all but the checksum itself and dstAddr).
_REST_WORDS = np.array([1, 1, 1, 1, 1, 0, 1, 1, 0, 0], dtype=np.int64)


class PipelineError(Exception):
    """A control-plane request the pipeline refuses; ``code`` is a gRPC status name."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


def ipv4_checksum(buf, offset: int = 14) -> int:
    """csum16 over the 20-byte IPv4 header at ``offset`` (checksum field as zero)."""
    words = _IPV4_WORDS.unpack_from(buf, offset)
    s = sum(words) - words[5]
    s = (s & 0xFFFF) + (s >> 16)
    s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


def frame_slot(buffer, offset: int, size: int) -> tuple[memoryview, np.ndarray]:
    """A frame slot for ``Pipeline.process_burst``: ``size`` (at least ``FRAME_LEN``)
    writable bytes of ``buffer`` at ``offset``, and the numpy view (big-endian words)
    of where an aggregation packet's payload lies in them."""
    if size < FRAME_LEN or offset + size > len(memoryview(buffer)):
        raise ValueError(f"a frame slot needs {FRAME_LEN}..{len(memoryview(buffer)) - offset} "
                         f"bytes, got {size}")
    view = memoryview(buffer)[offset:offset + size]
    words = np.ndarray((QAINA_WORDS,), dtype=">u4", buffer=buffer,
                       offset=offset + PAYLOAD_OFFSET)
    return view, words


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


class Table:
    """One P4 table: entries keyed by match values, an action and its parameters.

    A key is a tuple with one item per match field: an int for exact fields, a
    ``(value, prefix_len)`` pair for LPM fields. An action is ``(action_name, params)``
    with the parameters as a tuple of ints in P4Info order.
    """

    def __init__(self, info: TableInfo, actions: dict[int, ActionInfo], default):
        self.info = info
        self.name = info.name
        self.actions = {aid: actions[aid] for aid in info.action_ids}
        self.entries: dict[tuple, tuple] = {}
        self.default = default
        self.listeners = []

    def _check_action(self, action_id: int, params: tuple):
        if action_id not in self.actions:
            raise PipelineError("INVALID_ARGUMENT",
                                f"action id {action_id} is not an action of {self.name}")
        action = self.actions[action_id]
        if len(params) != len(action.params):
            raise PipelineError("INVALID_ARGUMENT", f"{action.name} takes "
                                f"{len(action.params)} parameters, got {len(params)}")
        for value, p in zip(params, action.params):
            if value >> p.bitwidth:
                raise PipelineError("INVALID_ARGUMENT",
                                    f"{action.name}: {p.name}={value} exceeds {p.bitwidth} bits")
        return action.name, tuple(params)

    def _check_key(self, key: tuple):
        if len(key) != len(self.info.match_fields):
            raise PipelineError("INVALID_ARGUMENT", f"{self.name} has "
                                f"{len(self.info.match_fields)} match fields, got {len(key)}")
        for value, mf in zip(key, self.info.match_fields):
            if mf.match_type == "LPM":
                v, plen = value
                if not 0 <= plen <= mf.bitwidth or v >> mf.bitwidth:
                    raise PipelineError("INVALID_ARGUMENT", f"{mf.name}: bad prefix {v}/{plen}")
                if v & ((1 << (mf.bitwidth - plen)) - 1):
                    raise PipelineError("INVALID_ARGUMENT",
                                        f"{mf.name}: bits beyond the /{plen} prefix are set")
            elif value >> mf.bitwidth:
                raise PipelineError("INVALID_ARGUMENT",
                                    f"{mf.name}={value} exceeds {mf.bitwidth} bits")

    def insert(self, key: tuple, action_id: int, params: tuple):
        self._check_key(key)
        action = self._check_action(action_id, params)
        if key in self.entries:
            raise PipelineError("ALREADY_EXISTS", f"{self.name}: entry {key} exists")
        if len(self.entries) >= self.info.size:
            raise PipelineError("RESOURCE_EXHAUSTED", f"{self.name} is full ({self.info.size})")
        self.entries[key] = action
        self._changed()

    def modify(self, key: tuple, action_id: int, params: tuple):
        self._check_key(key)
        action = self._check_action(action_id, params)
        if key not in self.entries:
            raise PipelineError("NOT_FOUND", f"{self.name}: no entry {key}")
        self.entries[key] = action
        self._changed()

    def delete(self, key: tuple):
        self._check_key(key)
        if self.entries.pop(key, None) is None:
            raise PipelineError("NOT_FOUND", f"{self.name}: no entry {key}")
        self._changed()

    def set_default(self, action_id: int, params: tuple):
        self.default = self._check_action(action_id, params)
        self._changed()

    def clear(self):
        self.entries.clear()
        self._changed()

    def _changed(self):
        for listener in self.listeners:
            listener(self)


class Pipeline:
    """The switch's data plane state and the per-packet program of ``qaina.p4``."""

    def __init__(self, p4info: P4Info, tx=None, port_tx=None):
        """``tx(port, frame)`` transmits a frame. ``port_tx(port)``, if given, returns
        what transmits on ``port`` (an object with ``send(frame)`` and
        ``send_block(frames)``, like ``PortTx``), None for a port that does not exist.
        """
        self.p4info = p4info
        self.tx = tx = tx or (lambda port, frame: None)
        self.port_tx = port_tx or (lambda port: PortTx(tx, port))
        self.tables = {}
        for name, default in (("MyIngress.ipv4_lpm", "MyIngress.no_route"),
                              ("MyIngress.aggregator_addr", NO_ACTION),
                              ("MyIngress.job_table", NO_ACTION),
                              ("MyIngress.member_table", NO_ACTION),
                              ("MyEgress.result_rewrite", NO_ACTION)):
            info = p4info.table(name)
            self.tables[info.id] = Table(info, p4info.actions, (default, ()))
        self.by_name = {t.name: t for t in self.tables.values()}

        reg = {r.name: r for r in p4info.registers.values()}
        copies = reg["MyIngress.agg_seen"].size
        if reg["MyIngress.agg_sum"].size != copies * QAINA_WORDS:
            raise PipelineError("INVALID_ARGUMENT", "agg_sum must hold QAINA_WORDS per slot copy")
        self.pool_slots = copies // 2
        self.agg_sum = np.zeros((copies, QAINA_WORDS), dtype=np.uint32)
        self.agg_seen = np.zeros(copies, dtype=np.uint32)
        self.agg_count = np.zeros(copies, dtype=np.uint8)
        self.agg_exp = np.zeros(copies, dtype=np.int8)
        #: register arrays by P4Info name, flat, as P4Runtime indexes them
        self.registers = {
            "MyIngress.agg_sum": self.agg_sum.reshape(-1),
            "MyIngress.agg_seen": self.agg_seen,
            "MyIngress.agg_count": self.agg_count,
            "MyIngress.agg_exp": self.agg_exp.view(np.uint8),
        }
        #: counters by P4Info name: int64 array [index, (packets, bytes)]
        self.counters = {c.name: np.zeros((c.size, 2), dtype=np.int64)
                         for c in p4info.counters.values()}
        #: multicast group id -> [(egress port, instance)]
        self.mcast_groups: dict[int, list[tuple[int, int]]] = {}

        # Lookup structures for the packet path, rebuilt whenever a table changes.
        self._lpm: list[tuple[int, dict]] = []
        self._lpm_default = None
        self._aggregator: set[int] = set()
        self._jobs: dict[int, tuple] = {}
        self._members: dict[tuple, int] = {}
        self._contributors: dict[int, tuple] = {}
        self._rewrite: dict[int, tuple] = {}
        self._replica_plans: dict[int, tuple] = {}
        for table in self.tables.values():
            table.listeners.append(self._rebuild)
            self._rebuild(table)

        self._bind_fast_views()
        self.internal_errors = 0
        self._own = bytearray(SLOT_ALIGN_OFFSET + 2048)
        self._own_slot = [frame_slot(self._own, SLOT_ALIGN_OFFSET, 2048)]
        # Results completed in the current burst and not sent yet: (frame, job counter
        # index, multicast group), in completion order.
        self._pending: list[tuple] = []
        self._stage = np.zeros((0, FRAME_LEN), dtype=np.uint8)  # results of one block
        self._stage_rows: list[memoryview] = []

    # -- control-plane views -----------------------------------------------------------
    def table(self, name: str) -> Table:
        return self.by_name[self.p4info.table(name).name]

    def _rebuild(self, table: Table):
        name = table.name
        if name == "MyIngress.ipv4_lpm":
            by_len: dict[int, dict] = {}
            for ((value, plen),), (action, params) in table.entries.items():
                port = params[0] if action == "MyIngress.forward" else None
                by_len.setdefault(plen, {})[value] = port
            self._lpm = sorted(((plen, d) for plen, d in by_len.items()), reverse=True)
            action, params = table.default
            self._lpm_default = params[0] if action == "MyIngress.forward" else None
        elif name == "MyIngress.aggregator_addr":
            self._aggregator = {ip for (ip,), (action, _) in table.entries.items()}
        elif name == "MyIngress.job_table":
            # An entry with NoAction is a hit that leaves the job's metadata at zero
            # (no workers), as on BMv2: its packets fail the worker check.
            self._jobs = {job: params if action == "MyIngress.set_job" else (0,) * 8
                          for (job,), (action, params) in table.entries.items()}
            self._contributors = self._contributor_index()
        elif name == "MyIngress.member_table":
            # (worker, port); NoAction leaves both at zero, as on BMv2.
            self._members = {(job, ip): params if action == "MyIngress.set_member" else (0, 0)
                             for (job, ip), (action, params) in table.entries.items()}
            self._contributors = self._contributor_index()
        elif name == "MyEgress.result_rewrite":
            self._rewrite = {rid: (params[0].to_bytes(6, "big"), _ADDR.pack(params[1]), params[2])
                             for (rid,), (action, params) in table.entries.items()
                             if action == "MyEgress.to_worker"}

    def _contributor_index(self) -> dict[int, tuple]:
        """job_table and member_table joined, keyed by ``job_id << 32 | srcAddr``.

        Each value is what the packet path needs of a member of a job whose entry is
        in range: ``(worker, port, cell, n_workers, first_slot, end_slot, mcast_grp)``.
        ``worker`` is -1 when the member's index is not below ``n_workers`` (no
        packet of it passes the worker check); ``port`` is the ingress port its
        packets must arrive on; ``cell`` is the index of the job's packet count in a
        flat counter view (``2 * job_index``); valid slots are
        ``first_slot <= slot < end_slot``. Members of jobs out of range
        (``job_misses``) are left out.
        """
        index = {}
        for (job_id, ip), (worker, port) in self._members.items():
            job = self._jobs.get(job_id)
            if job is None or not self._job_in_range(job):
                continue
            job_index, n_workers, slot_base, slot_count, mcast_grp = job[:5]
            end = min(slot_base + slot_count, self.pool_slots)
            index[job_id << 32 | ip] = (worker if worker < n_workers else -1, port,
                                        2 * job_index, n_workers, slot_base, end, mcast_grp)
        return index

    @staticmethod
    def _job_in_range(job: tuple) -> bool:
        """Whether a job entry's counter index and worker count fit the program."""
        return job[0] < MAX_JOBS and job[1] <= MAX_WORKERS

    def _miss_reason(self, job_id: int) -> int:
        """Why a packet of ``job_id`` from a source not in the contributor index drops,
        in the order ``qaina.p4`` checks: job entry, its range, membership."""
        job = self._jobs.get(job_id)
        if job is None:
            return Drop.UNKNOWN_JOB
        return Drop.NON_MEMBER if self._job_in_range(job) else Drop.BAD_JOB

    def _replica_plan(self, mcast_grp: int) -> tuple:
        """``(replicas, block)``: a multicast group's copies, egress rewrites applied.

        Each replica is ``(send, mac, ip, worker, ip_sum)``: ``send`` transmits on the
        replica's port (None: no such port), ``ip_sum`` is the sum of the two 16-bit
        halves of ``ip``; ``mac`` is None for a replica that egress leaves as ingress
        made it (instance 0, or no ``result_rewrite`` entry). ``block`` is the same as
        arrays for ``_multicast_block`` (None if a replica is left as ingress made it):
        ``(transmitters, macs, ips, workers, ip_sums)``.
        """
        replicas = self.mcast_groups.get(mcast_grp)
        if not replicas:
            return (), None
        rewrites = self._rewrite
        cached = self._replica_plans.get(mcast_grp)
        if cached is not None and cached[1] is rewrites and cached[0] == replicas:
            return cached[2]
        plan, transmitters = [], []
        for port, rid in replicas:
            transmitter = self.port_tx(port)
            transmitters.append(transmitter)
            send = None if transmitter is None else transmitter.send
            target = rid and rewrites.get(rid)
            if target:
                mac, ip, worker = target
                plan.append((send, mac, ip, worker, (ip[0] << 8 | ip[1]) + (ip[2] << 8 | ip[3])))
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
        self._replica_plans[mcast_grp] = (list(replicas), rewrites, result)
        return result

    # -- data plane --------------------------------------------------------------------
    def _bind_fast_views(self):
        """Scalar views of the register and counter arrays for the packet path.

        A memoryview reads and writes one cell of a numpy array as a Python int, an
        order of magnitude faster than numpy scalar indexing; the arrays stay the
        state that P4Runtime reads.
        """
        self._seen = memoryview(self.agg_seen)
        self._count = memoryview(self.agg_count)
        self._exp = memoryview(self.agg_exp)
        self._rows = list(self.agg_sum)  # one view per slot copy
        cells = {name: memoryview(arr.reshape(-1)) for name, arr in self.counters.items()}
        self._c_opened = cells["MyIngress.slots_opened"]
        self._c_closed = cells["MyIngress.slots_closed"]
        self._c_agg = cells["MyIngress.agg_packets"]
        self._c_retx = cells["MyIngress.retx_answered"]
        self._c_drops = cells["MyIngress.drops"]
        self._c_results = cells["MyEgress.results_sent"]

    def process(self, in_port: int, frame, length: int | None = None):
        """Run one frame (``length`` bytes of ``frame``, all of it by default)."""
        view = self._own_slot[0][0]
        length = len(frame) if length is None else min(length, len(frame))
        length = min(length, len(view))
        view[:length] = memoryview(frame).cast("B")[:length]
        self.process_burst(in_port, self._own_slot, (length,))

    def process_burst(self, in_port: int, slots, lengths, frames: np.ndarray | None = None):
        """Run frames received on ``in_port``, in order, through the pipeline.

        ``slots[i]`` is a ``frame_slot`` holding frame ``i`` (``lengths[i]`` bytes) at
        its start; the pipeline rewrites it in place and sends from it. ``frames``, if
        given, is the same memory as a uint8 array with frame ``i`` at the start of
        row ``i``. Whatever the frames cause is sent before this returns, in the order
        of the frames that caused it.
        """
        try:
            if (frames is None or len(lengths) < BURST_MIN
                    or not self._contribution_burst(in_port, slots, lengths, frames)):
                self._process_frames(in_port, slots, lengths)
        except Exception:  # a bug must not stop the switch: count, log, go on
            self._internal_error(sum(lengths), len(lengths))
        finally:
            if self._pending:
                try:
                    self._send_results()
                except Exception:
                    self._pending.clear()
                    self._internal_error(0, 0)

    def _process_frames(self, in_port: int, slots, lengths):
        """``process_burst`` one frame after the other, as ``qaina.p4`` does."""
        # Everything an aggregation packet touches, bound once per burst; a table
        # change made meanwhile applies from the next burst on.
        aggregator = self._aggregator
        contributors = self._contributors
        pool = self.pool_slots
        seen_cells, count_cells, exp_cells = self._seen, self._count, self._exp
        rows = self._rows
        c_agg, c_opened, c_closed = self._c_agg, self._c_opened, self._c_closed
        pending = self._pending
        unpack = _HEADERS.unpack_from
        add = np.add
        for (buf, payload), length in zip(slots, lengths):
            try:
                if length < FRAME_LEN:
                    self._process_short(in_port, buf, length)
                    continue
                (ethertype, vihl, total_len, frag, ttl, proto, src, dst, dport, udp_len,
                 job_id, worker, flags, slot, ver, exp, seq) = unpack(buf, 12)
                if ethertype != 0x0800:
                    self._drop(Drop.NOT_IPV4, length)
                    continue
                if dst not in aggregator:
                    self._forward(buf, length, dst, ttl)
                    continue
                # Addressed to this aggregator: parse the rest as the P4 parser does.
                if (vihl & 0x0F != 5 or frag & _FRAGMENT or proto != 17
                        or total_len != IPV4_TOTAL_LEN or dport != QAINA_UDP_PORT
                        or udp_len != UDP_TOTAL_LEN):
                    self._drop(Drop.MALFORMED, length)
                    continue
                if flags & FLAG_RESULT or ver > 1:
                    self._drop(Drop.BAD_FLAGS, length)
                    continue
                member = contributors.get(job_id << 32 | src)
                if member is None:
                    self._drop(self._miss_reason(job_id), length)
                    continue
                member_worker, member_port, j, n_workers, first_slot, end_slot, mcast_grp = member
                if in_port != member_port:
                    self._drop(Drop.WRONG_PORT, length)
                    continue
                if worker != member_worker:
                    self._drop(Drop.BAD_WORKER, length)
                    continue
                if not first_slot <= slot < end_slot:
                    self._drop(Drop.BAD_SLOT, length)
                    continue
                # qaina.p4 indexes its registers with bit<32> arithmetic: slot + ver * POOL_SLOTS.
                if ver:
                    copy = slot + pool
                    shadow = slot
                else:
                    copy = slot
                    shadow = slot + pool
                mask = 1 << worker
                seen = seen_cells[copy]
                count = count_cells[copy]
                if not seen & mask:
                    # First contribution of this worker to this use of the slot.
                    seen_cells[copy] = seen | mask
                    seen = seen_cells[shadow]
                    if seen & mask:
                        seen_cells[shadow] = seen ^ mask
                    c_agg[j] += 1
                    c_agg[j + 1] += length
                    row = rows[copy]
                    if count == 0:
                        row[:] = payload
                        exp_cells[copy] = exp
                        c_opened[j] += 1
                        c_opened[j + 1] += length
                    else:
                        add(row, payload, row)
                        stored = exp_cells[copy]
                        if stored > exp:
                            exp = stored
                        else:
                            exp_cells[copy] = exp
                    count = (count + 1) & 0xFF  # bit<8>
                    if count != n_workers:
                        count_cells[copy] = count
                        continue
                    count_cells[copy] = 0
                    c_closed[j] += 1
                    c_closed[j + 1] += length
                    # result_to_all: the sum leaves from the aggregator's MAC and address.
                    payload[:] = row
                    buf[_QAINA_EXP] = exp & 0xFF
                    buf[_QAINA_FLAGS] = FLAG_RESULT
                    buf[6:12] = buf[0:6]
                    buf[26:30] = buf[30:34]
                    buf[22] = RESULT_TTL
                    buf[40] = buf[41] = 0  # udp checksum
                    pending.append((buf, j, mcast_grp))
                elif count == 0:
                    # A retransmission after the result went out: answer from the copy.
                    payload[:] = rows[copy]
                    self._result_to_sender(buf, in_port, j, exp_cells[copy], length)
                else:
                    self._drop(Drop.DUPLICATE, length)
            except Exception:  # counted as INTERNAL, the burst goes on
                self._internal_error(length)

    def _contribution_burst(self, in_port: int, slots, lengths, frames: np.ndarray) -> bool:
        """Run a whole burst with numpy if it is what a worker sends: first
        contributions of one member of a job, each to a different slot. Returns
        False, having changed nothing, for any other burst.

        Packets to different slots touch disjoint register cells, so applying them
        all at once leaves the state, counters and results that applying them one
        by one in ``process_burst`` does.
        """
        k = len(lengths)
        if min(lengths) < FRAME_LEN:
            return False
        headers = frames[:k, 12:50] & _SHARED_MASK
        if not (headers == headers[0]).all():
            return False
        # The checks of process_burst on the first frame hold for all of them.
        (ethertype, vihl, total_len, frag, ttl, proto, src, dst, dport, udp_len,
         job_id, worker, flags, slot, ver, exp, seq) = _HEADERS.unpack_from(slots[0][0], 12)
        if (ethertype != 0x0800 or dst not in self._aggregator or vihl & 0x0F != 5
                or frag & _FRAGMENT or proto != 17 or total_len != IPV4_TOTAL_LEN
                or dport != QAINA_UDP_PORT or udp_len != UDP_TOTAL_LEN
                or flags & FLAG_RESULT or ver > 1):
            return False
        member = self._contributors.get(job_id << 32 | src)
        if member is None or member[0] != worker or member[1] != in_port:
            return False
        _, _, j, n_workers, first_slot, end_slot, mcast_grp = member
        slot_ids = frames[:k, QAINA_OFFSET + 4:QAINA_OFFSET + 6].view(">u2")[:, 0].astype(np.intp)
        increasing = (np.diff(slot_ids) > 0).all()  # a window in order: distinct slots
        if increasing:
            lowest, highest = slot_ids[0], slot_ids[-1]
        else:
            lowest, highest = slot_ids.min(), slot_ids.max()
        if (lowest < first_slot or highest >= end_slot
                or not increasing and len(np.unique(slot_ids)) != k):
            return False
        ver_pool = frames[:k, QAINA_OFFSET + 6].astype(np.intp) * self.pool_slots
        copies = slot_ids + ver_pool
        mask = 1 << worker
        seen = self.agg_seen[copies]
        if (seen & mask).any():
            return False

        # First contributions of this worker to these uses of the slots.
        self.agg_seen[copies] = seen | mask
        self.agg_seen[slot_ids + (self.pool_slots - ver_pool)] &= ~mask & 0xFFFFFFFF  # shadows
        count = self.agg_count[copies]
        opened = count == 0
        payloads = frames[:k, PAYLOAD_OFFSET:FRAME_LEN].view(">u4")
        if opened.all():
            self.agg_sum[copies] = payloads
        elif not opened.any():
            self.agg_sum[copies] += payloads
        else:
            self.agg_sum[copies[opened]] = payloads[opened]
            added = ~opened
            self.agg_sum[copies[added]] += payloads[added]
        exps = frames[:k, _QAINA_EXP].view(np.int8)
        exps = np.where(opened, exps, np.maximum(self.agg_exp[copies], exps))
        self.agg_exp[copies] = exps
        count += 1
        closed = count == n_workers
        self.agg_count[copies] = np.where(closed, 0, count)
        self._count_packets(self._c_agg, j, lengths)
        self._count_packets(self._c_opened, j, lengths, opened)
        done = np.flatnonzero(closed)
        if not len(done):
            return True
        self._count_packets(self._c_closed, j, lengths, closed)
        # result_to_all, as process_burst does it for one packet.
        if len(done) == k:  # every packet completed its slot: work in place
            results, completed, exps = frames[:k, :FRAME_LEN], copies, exps
        else:
            results, completed, exps = frames[done, :FRAME_LEN], copies[done], exps[done]
        results[:, PAYLOAD_OFFSET:].view(">u4")[...] = self.agg_sum[completed]
        results[:, _QAINA_EXP] = exps.view(np.uint8)
        results[:, _QAINA_FLAGS] = FLAG_RESULT
        results[:, 6:12] = results[:, 0:6]
        results[:, 26:30] = results[:, 30:34]
        results[:, 22] = RESULT_TTL
        results[:, 40:42] = 0  # udp checksum
        if len(done) < k:
            frames[done, :FRAME_LEN] = results  # fancy indexing copied them
        replicas, block = self._replica_plan(mcast_grp)
        if not replicas:
            return True
        if len(done) >= BLOCK_MIN and block is not None:
            c = self._c_results
            c[j] += len(replicas) * len(done)
            c[j + 1] += len(replicas) * len(done) * FRAME_LEN
            self._multicast_block(results, block)
        else:
            self._pending.extend((slots[i][0], j, mcast_grp) for i in done.tolist())
        return True

    @staticmethod
    def _count_packets(cells, j: int, lengths, which: np.ndarray | None = None):
        """Count the packets of ``lengths`` (those where ``which`` is true, if given)."""
        if which is None:
            cells[j] += len(lengths)
            cells[j + 1] += sum(lengths)
        elif which.any():
            which = which.tolist()
            cells[j] += sum(which)
            cells[j + 1] += sum(itertools.compress(lengths, which))

    def _process_short(self, in_port: int, buf, length: int):
        """A frame shorter than an aggregation packet: IPv4 to forward, or a drop."""
        if length < 34 or buf[12] != 0x08 or buf[13] != 0x00:
            self._drop(Drop.NOT_IPV4, length)
            return
        dst = _ADDR.unpack_from(buf, 30)[0]
        if dst in self._aggregator:
            # Too short for Ethernet/IPv4/UDP/QAINA/payload.
            self._drop(Drop.MALFORMED, length)
            return
        self._forward(buf, length, dst, buf[22])

    def _internal_error(self, length: int, packets: int = 1):
        """Processing failed (a bug): count the packets under ``INTERNAL``, log why."""
        d = self._c_drops
        d[2 * Drop.INTERNAL] += packets
        d[2 * Drop.INTERNAL + 1] += length
        self.internal_errors += 1
        if self.internal_errors <= 10 or self.internal_errors % 1000 == 0:
            log.exception("internal error #%d while processing a packet", self.internal_errors)

    def _drop(self, reason: int, length: int):
        d = self._c_drops
        d[2 * reason] += 1
        d[2 * reason + 1] += length

    def _route(self, dst: int):
        """Egress port of the longest matching prefix, None for no_route."""
        for plen, nets in self._lpm:
            port = nets.get(dst & ~((1 << (32 - plen)) - 1) & 0xFFFFFFFF, _MISS)
            if port is not _MISS:
                return port
        return self._lpm_default

    def _forward(self, buf, length: int, dst: int, ttl: int):
        """ipv4_lpm: forward with the TTL decremented, or drop for no_route."""
        port = self._route(dst)
        if port is None:
            self._drop(Drop.NO_ROUTE, length)
            return
        if self._pending:  # frames leave in the order their packets caused them
            self._send_results()
        buf[22] = (ttl - 1) & 0xFF
        _CHECKSUM.pack_into(buf, 24, ipv4_checksum(buf))
        self.tx(port, buf[:length])

    def _send_results(self):
        """Multicast the pending results, in order; a run of at least ``BLOCK_MIN`` of
        one group as one block per port."""
        results = self._pending[:]
        self._pending.clear()
        n = len(results)
        i = 0
        while i < n:
            mcast_grp = results[i][2]
            k = i + 1
            while k < n and results[k][2] == mcast_grp:
                k += 1
            replicas, block = self._replica_plan(mcast_grp)
            if replicas:
                if k - i >= BLOCK_MIN and block is not None:
                    self._multicast_block(self._stage_results(results[i:k], len(replicas)), block)
                else:
                    for buf, j, _ in results[i:k]:
                        self._multicast(buf, j, replicas)
            i = k

    def _stage_results(self, results, copies: int) -> np.ndarray:
        """The frames of ``results`` as the rows of one array; counts the ``copies``
        of each that will be sent."""
        k = len(results)
        if len(self._stage) < k:
            self._stage = np.zeros((max(k, 64), FRAME_LEN), dtype=np.uint8)
            self._stage_rows = [memoryview(row) for row in self._stage]
        c = self._c_results
        for row, (buf, j, _) in zip(self._stage_rows, results):
            row[:] = buf[:FRAME_LEN]
            c[j] += copies
            c[j + 1] += copies * FRAME_LEN
        return self._stage[:k]

    def _multicast(self, buf, j: int, replicas):
        """Send the result in ``buf`` to every replica of its multicast group."""
        if any(r[1] is None for r in replicas):  # left as ingress made them
            mac, ip = bytes(buf[0:6]), bytes(buf[30:34])
            sender = (mac, ip, buf[_QAINA_WORKER], (ip[0] << 8 | ip[1]) + (ip[2] << 8 | ip[3]))
        # Replicas differ only in destination MAC, address and worker: the IPv4
        # checksum is the sum of the rest plus the destination's two 16-bit halves.
        words = _IPV4_WORDS.unpack_from(buf, 14)
        rest = sum(words) - words[5] - words[8] - words[9]
        frame = buf[:FRAME_LEN]
        for send, mac, ip, worker, ip_sum in replicas:
            if mac is None:
                mac, ip, worker, ip_sum = sender
            buf[0:6] = mac
            buf[30:34] = ip
            buf[_QAINA_WORKER] = worker
            c = rest + ip_sum
            c = (c & 0xFFFF) + (c >> 16)
            c = ~((c & 0xFFFF) + (c >> 16)) & 0xFFFF
            buf[24] = c >> 8
            buf[25] = c & 0xFF
            if send is not None:
                send(frame)
        c = self._c_results
        c[j] += len(replicas)
        c[j + 1] += len(replicas) * FRAME_LEN

    def _multicast_block(self, results: np.ndarray, block):
        """``_multicast`` for many results of one group at once (the rows of
        ``results``): every replica of every result is built with numpy, and each
        port gets its copies as one block."""
        transmitters, macs, ips, workers, ip_sums = block
        count, k = len(transmitters), len(results)
        # The checksum as _multicast folds it: for a sum s > 0 the folded one's
        # complement sum is (s - 1) % 0xFFFF + 1.
        sums = ip_sums + results[:, 14:34].view(">u2") @ _REST_WORDS  # (replica, result)
        checksums = (0xFFFE - (sums - 1) % 0xFFFF).astype(">u2")
        frames = np.empty((count, k, FRAME_LEN), dtype=np.uint8)
        frames[...] = results[:, :FRAME_LEN]
        frames[:, :, 0:6] = macs
        frames[:, :, 30:34] = ips
        frames[:, :, _QAINA_WORKER] = workers
        frames[:, :, 24:26] = checksums.view(np.uint8).reshape(count, k, 2)
        for transmitter, copies in zip(transmitters, frames):
            if transmitter is not None:
                transmitter.send_block(copies)

    def _result_to_sender(self, buf, in_port: int, j: int, exp: int, length: int):
        """Answer a retransmission with the stored result in ``buf``'s payload."""
        c = self._c_retx
        c[j] += 1
        c[j + 1] += length
        mac = bytes(buf[0:6])
        buf[0:6] = buf[6:12]
        buf[6:12] = mac
        ip = bytes(buf[30:34])
        buf[30:34] = buf[26:30]
        buf[26:30] = ip
        buf[22] = RESULT_TTL
        buf[40] = buf[41] = 0  # udp checksum
        buf[_QAINA_FLAGS] = FLAG_RESULT | FLAG_RETX
        buf[_QAINA_EXP] = exp & 0xFF
        _CHECKSUM.pack_into(buf, 24, ipv4_checksum(buf))
        c = self._c_results
        c[j] += 1
        c[j + 1] += FRAME_LEN
        if self._pending:  # frames leave in the order their packets caused them
            self._send_results()
        self.tx(in_port, buf[:FRAME_LEN])
