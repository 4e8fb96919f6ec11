"""The ``qaina.p4`` pipeline in software: its state and its per-packet program.

``Pipeline.process_burst(port, slots, lengths)`` runs received frames through the
steps of ``qaina.p4`` and sends what they cause through ``tx(port, frame)``;
``Pipeline.process(port, frame)`` does the same for one frame. State lives in the
objects the P4 program declares, named by its P4Info: tables (``tables.Table``),
registers and counters (numpy arrays), multicast groups (``replication``).

Read it next to ``qaina.p4``:

* ``MyParser``: ``parser.HEADERS`` and the first checks of ``_process_frames``;
* ``MyIngress.apply``: ``_process_frames`` (not IPv4, ``source`` for
  ``source_guard`` and ``port_guard``, forged results, ``ipv4_lpm`` via ``_forward``),
  ``check`` (the aggregation checks, in the program's order, each drop reason
  where the program has it), ``_aggregate`` (the register updates, result to all or
  answer to the sender); a shared job's in ``shared.py``);
* the PRE and ``MyEgress``: ``replication.py``.

``_process_frames`` is the reference: frames one by one, as the P4 program takes
them. ``burst.py`` applies a worker's window at once with numpy, and is tested frame
for frame against it.
"""

from __future__ import annotations

import logging
import struct

import numpy as np

from ..constants import MAX_JOBS, MAX_WORKERS, RESULT_TTL, Drop
from ..header import (ETH_DST, ETH_SRC, ETH_TYPE, FLAG_RESULT, FLAG_RETX, IP_CSUM, IP_DST,
                      IP_FLAGS_FRAG, IP_PROTO, IP_SRC, IP_TTL, IP_VIHL, PAYLOAD_OFFSET,
                      PAYLOAD_WORDS, QAINA_AT, QAINA_UDP_PORT, UDP_CSUM, UDP_DPORT,
                      ipv4_checksum, wire)
from ..p4info import P4Info
from .burst import BURST_MIN, take_burst
from .parser import ETHERTYPE_IPV4, FRAGMENT, HEADERS, IP_PROTO_UDP, parses_qaina
from .replication import PortTx, Replication
from .shared import UPPER, SharedPool, count_packet as _count
from .tables import NO_UPSTREAM, PipelineError, Table, rewrite_of, upstream_of

log = logging.getLogger("qaina.switch")

NO_ACTION = "NoAction"
_MISS = object()
_ADDR = struct.Struct("!I")
_CHECKSUM = struct.Struct("!H")
_SHORT = struct.Struct("!H")
_FLAGS, _EXP, _WORKER = QAINA_AT["flags"], QAINA_AT["exp"], QAINA_AT["worker"]

#: A frame slot is placed at this offset modulo 4 in its buffer so that the payload
#: words are 4-byte aligned.
SLOT_ALIGN_OFFSET = (-PAYLOAD_OFFSET) % 4
MAX_WORDS = max(PAYLOAD_WORDS)
SLOT_MIN = wire(MAX_WORDS).frame_len


def frame_slot(buffer, offset: int, size: int) -> tuple[memoryview, np.ndarray]:
    """A frame slot for ``Pipeline.process_burst``: ``size`` (at least ``SLOT_MIN``,
    an aggregation packet of the largest build) writable bytes of ``buffer`` at
    ``offset``, and the numpy view (big-endian words) of where the largest build's
    payload lies in them."""
    if size < SLOT_MIN or offset + size > len(memoryview(buffer)):
        raise ValueError(f"a frame slot needs {SLOT_MIN}..{len(memoryview(buffer)) - offset} "
                         f"bytes, got {size}")
    view = memoryview(buffer)[offset:offset + size]
    words = np.ndarray((MAX_WORDS,), dtype=">u4", buffer=buffer,
                       offset=offset + PAYLOAD_OFFSET)
    return view, words


class Pipeline(SharedPool):
    """The switch's data plane state and the per-packet program of ``qaina.p4``."""

    TABLES = ("MyIngress.ipv4_lpm", "MyIngress.aggregator_addr", "MyIngress.job_table",
              "MyIngress.member_table", "MyIngress.port_guard", "MyIngress.source_guard",
              "MyIngress.upstream_table", "MyEgress.result_rewrite")

    def __init__(self, p4info: P4Info, tx=None, port_tx=None):
        """``tx(port, frame)`` transmits a frame. ``port_tx(port)``, if given, returns
        what transmits on ``port`` (an object with ``send(frame)`` and
        ``send_block(frames)``, like ``PortTx``), None for a port that does not exist.
        """
        self.p4info = p4info
        self.tx = tx = tx or (lambda port, frame: None)
        self.tables = {}
        for name in self.TABLES:
            info = p4info.table(name)
            default = (p4info.action(info.default_action_id).name
                       if info.default_action_id is not None else NO_ACTION)
            self.tables[info.id] = Table(info, p4info.actions, (default, ()))
        self.by_name = {t.name: t for t in self.tables.values()}
        self._make_registers(p4info)
        #: counters by P4Info name: uint64 array [index, (packets, bytes)], as BMv2's (a
        #: P4Runtime MODIFY may set up to 2**63 - 1; counting on from there never
        #: overflows in practice; a Read gives a cell past 2**63 - 1 wrapped, as PI does)
        self.counters = {c.name: np.zeros((c.size, 2), dtype=np.uint64)
                         for c in p4info.counters.values()}
        #: the same as flat memoryviews, for the packet path (cell 2i: packets of i)
        self.cells = {name: memoryview(arr.reshape(-1)) for name, arr in self.counters.items()}
        self.pre = Replication(port_tx or (lambda port: PortTx(tx, port)),
                               self.cells["MyEgress.results_sent"], self.frame_len)
        #: multicast group id -> [(egress port, instance)]
        self.mcast_groups = self.pre.groups
        self.mcast_replicas = 0  # of all groups (P4Runtime keeps it; a cap holds on it)
        self.internal_errors = 0
        # Lookup structures for the packet path, rebuilt whenever a table changes.
        self._lpm: list[tuple[int, dict]] = []
        self._lpm_default = None
        self.aggregator: set[int] = set()
        #: ingress ports whose sources are checked (port_guard)
        self.guarded: set[int] = set()
        #: source_guard: ``port << 32 | srcAddr`` -> results (1: RESULTs may come in)
        self.sources: dict[int, int] = {}
        #: results_in of a source no entry lists on an unguarded port (the default action)
        self.unlisted_results = 0
        self._jobs: dict[int, tuple] = {}
        self._members: dict[tuple, tuple] = {}
        self._contributors: dict[int, tuple] = {}
        #: upstream_table: job -> (port, address, MAC, worker), None for NoAction or port
        #: 0; ``_upstream_default`` for a job without an entry (the default action)
        self._upstream: dict[int, tuple | None] = {}
        self._upstream_default: tuple | None = None
        for table in self.tables.values():
            table.listeners.append(self._rebuild)
            self._rebuild(table)
        self._own = bytearray(SLOT_ALIGN_OFFSET + 2048)
        self._own_slot = [frame_slot(self._own, SLOT_ALIGN_OFFSET, 2048)]

    def _make_registers(self, p4info: P4Info):
        """The register arrays of the P4Info, and scalar views for the packet path
        (a memoryview reads one cell as a Python int an order of magnitude faster
        than numpy indexing; the arrays stay the state P4Runtime reads)."""
        reg = {r.name: r for r in p4info.registers.values()}
        copies = reg["MyIngress.agg_seen"].size
        words, rest = divmod(reg["MyIngress.agg_sum"].size, copies)
        if rest or words not in PAYLOAD_WORDS:
            raise PipelineError("INVALID_ARGUMENT", "agg_sum must hold the payload words of a "
                                f"qaina.p4 build ({PAYLOAD_WORDS}) per slot copy")
        #: the build this pipeline runs: payload words and packet lengths
        self.wire = wire(words)
        self.words, self.frame_len = words, self.wire.frame_len
        self.pool_slots = copies // 2
        self.agg_sum = np.zeros((copies, words), dtype=np.uint32)
        self.agg_seen = np.zeros(copies, dtype=np.uint32)
        self.agg_count = np.zeros(copies, dtype=np.uint8)
        self.agg_exp = np.zeros(copies, dtype=np.int8)
        self.agg_owner = np.zeros(copies, dtype=np.uint16)
        self.agg_final = np.zeros(copies, dtype=np.uint8)
        self.agg_seq = np.zeros(copies, dtype=np.uint32)
        #: register arrays by P4Info name, flat, as P4Runtime indexes them
        self.registers = {
            "MyIngress.agg_sum": self.agg_sum.reshape(-1),
            "MyIngress.agg_seen": self.agg_seen,
            "MyIngress.agg_count": self.agg_count,
            "MyIngress.agg_exp": self.agg_exp.view(np.uint8),
            "MyIngress.agg_owner": self.agg_owner,
            "MyIngress.agg_final": self.agg_final,
            "MyIngress.agg_seq": self.agg_seq,
        }
        #: not the program's: per slot copy, the workers whose contribution to its
        #: current use the overloaded switch shed (``burst.shed_mask``), how many
        #: frames it shed, and how many it still owes to its shed level
        self.shed_held = np.zeros(copies, dtype=np.uint32)
        self.shed_packets = 0
        self.shed_due = 0.0
        self.shed_pending = 0  # slot copies whose use is half shed (shed_held not 0)
        self._seen = memoryview(self.agg_seen)
        self._count = memoryview(self.agg_count)
        self._exp = memoryview(self.agg_exp)
        self._owner = memoryview(self.agg_owner)
        self._rows = list(self.agg_sum)  # one view per slot copy

    # -- control-plane views -----------------------------------------------------------
    def table(self, name: str) -> Table:
        return self.by_name[self.p4info.table(name).name]

    def _rebuild(self, table: Table):
        name = table.name
        entries = table.entries.items()
        if name == "MyIngress.ipv4_lpm":
            by_len: dict[int, dict] = {}
            for ((value, plen),), (action, params) in entries:
                port = params[0] if action == "MyIngress.forward" else None
                by_len.setdefault(plen, {})[value] = port
            self._lpm = sorted(((plen, d) for plen, d in by_len.items()), reverse=True)
            action, params = table.default
            self._lpm_default = params[0] if action == "MyIngress.forward" else None
        elif name == "MyIngress.aggregator_addr":
            self.aggregator = {ip for (ip,), _ in entries}
        elif name == "MyIngress.port_guard":
            self.guarded = {port for (port,), _ in entries}  # NoAction hits too
        elif name == "MyIngress.source_guard":
            # NoAction admits the source and leaves results_in at zero, as on BMv2.
            self.sources = {port << 32 | ip: params[0] if action == "MyIngress.allow_source"
                            else 0 for (port, ip), (action, params) in entries}
            action, params = table.default  # a miss admits nothing, but sets results_in
            self.unlisted_results = params[0] if action == "MyIngress.allow_source" else 0
        elif name == "MyIngress.job_table":
            # An entry with NoAction is a hit that leaves the job's metadata at zero
            # (no workers), as on BMv2: its packets fail the worker check.
            self._jobs = {job: params if action == "MyIngress.set_job" else (0,) * 9
                          for (job,), (action, params) in entries}
            self._contributors = self._contributor_index()
        elif name == "MyIngress.member_table":
            # (worker, port); NoAction leaves both at zero, as on BMv2.
            self._members = {(job, ip): params if action == "MyIngress.set_member" else (0, 0)
                             for (job, ip), (action, params) in entries}
            self._contributors = self._contributor_index()
        elif name == "MyIngress.upstream_table":
            # (port, addr, mac as bytes, worker); port 0 (or NoAction) means none. The
            # program applies the table without looking at hit: a miss runs the default.
            self._upstream = {job: upstream_of(action, params)
                              for (job,), (action, params) in entries}
            self._upstream_default = upstream_of(*table.default)
            self._contributors = self._contributor_index()
        elif name == "MyEgress.result_rewrite":
            self.pre.rewrites = {rid: rewrite_of(action, params)
                                 for (rid,), (action, params) in entries}
            self.pre.rewrite_default = rewrite_of(*table.default)

    def _contributor_index(self) -> dict[int, tuple]:
        """job_table and member_table joined, keyed by ``job_id << 32 | srcAddr``.

        Each value is what the packet path needs of a member of a job whose entry is
        in range: ``(worker, port, cell, n_workers, first_slot, end_slot, mcast_grp,
        upstream, shared)``.
        ``worker`` is -1 when the member's index is not below ``n_workers`` (no
        packet of it passes the worker check); ``port`` is the ingress port its
        packets must arrive on; ``cell`` is the index of the job's packet count in a
        flat counter view (``2 * job_index``); valid slots are
        ``first_slot <= slot < end_slot``; ``upstream`` is the job's ``upstream_table``
        entry (port, address, MAC, worker index there), None where this switch is the
        job's top aggregator; ``shared`` is true for a job of the shared allocation
        (``set_job``'s ``shared`` not 0). Members of jobs out of range are left out.
        """
        index = {}
        for (job_id, ip), (worker, port) in self._members.items():
            job = self._jobs.get(job_id)
            if job is None or not self._job_in_range(job):
                continue
            job_index, n_workers, slot_base, slot_count, mcast_grp = job[:5]
            end = min(slot_base + slot_count, self.pool_slots)
            index[job_id << 32 | ip] = (worker if worker < n_workers else -1, port,
                                        2 * job_index, n_workers, slot_base, end, mcast_grp,
                                        self._upstream.get(job_id, self._upstream_default),
                                        job[8] != 0)
        return index

    @staticmethod
    def _job_in_range(job: tuple) -> bool:
        """Whether a job entry's counter index and worker count fit the program."""
        return job[0] < MAX_JOBS and job[1] <= MAX_WORKERS

    # -- data plane --------------------------------------------------------------------
    def process(self, in_port: int, frame, length: int | None = None):
        """Run one frame (``length`` bytes of ``frame``, all of it by default)."""
        view = self._own_slot[0][0]
        length = len(frame) if length is None else min(length, len(frame))
        length = min(length, len(view))
        view[:length] = memoryview(frame).cast("B")[:length]
        self.process_burst(in_port, self._own_slot, (length,))

    def process_burst(self, in_port: int, slots, lengths, frames: np.ndarray | None = None,
                      shed_level: int = 0):
        """Run frames received on ``in_port``, in order, through the pipeline.

        ``slots[i]`` is a ``frame_slot`` holding frame ``i`` (``lengths[i]`` bytes) at
        its start; the pipeline rewrites it in place and sends from it. ``frames``, if
        given, is the same memory as a uint8 array with frame ``i`` at the start of
        row ``i``. Whatever the frames cause is sent before this returns, in the order
        of the frames that caused it. An error inside is counted (``internal``) and
        logged; it never stops the switch. ``shed_level`` > 0: the switch is overloaded,
        shed that share of the slot uses not opened yet (``burst.shed_mask``; counted
        in ``shed_packets``, not by the program, like frames a full queue drops).
        """
        try:
            if frames is not None and (shed_level or self.shed_pending):
                self._shed_burst(in_port, slots, lengths, frames, shed_level)
            elif (frames is None or len(lengths) < BURST_MIN
                    or not take_burst(self, in_port, slots, lengths, frames)):
                self._process_frames(in_port, slots, lengths)
        except Exception:
            self._internal_error(sum(lengths), len(lengths))
        finally:
            if self.pre.pending:
                try:
                    self.pre.flush()
                except Exception:
                    self.pre.pending.clear()
                    self._internal_error(0, 0)

    def _shed_burst(self, in_port: int, slots, lengths, frames: np.ndarray, level: int):
        """``process_burst`` while the switch sheds, or some slot uses are half shed:
        every contribution goes through ``burst.shed_mask``, a burst that is not one
        member's frame by frame."""
        if take_burst(self, in_port, slots, lengths, frames, level, shedding=True):
            return
        for i, length in enumerate(lengths):
            if not take_burst(self, in_port, slots[i:i + 1], lengths[i:i + 1],
                              frames[i:i + 1], level, shedding=True):
                self._process_frames(in_port, slots[i:i + 1], (length,))

    def _process_frames(self, in_port: int, slots, lengths):
        """The program, frame after frame (the reference for the burst path)."""
        # What every frame needs, bound once per burst: a table change made meanwhile
        # applies from the next burst on.
        aggregator, unpack, check = self.aggregator, HEADERS.unpack_from, self.check
        sources, guarded, port_key = self.sources, in_port in self.guarded, in_port << 32
        unlisted = self.unlisted_results
        for (buf, payload), length in zip(slots, lengths):
            try:
                if length < self.frame_len:
                    self._process_short(in_port, buf, length)
                    continue
                h = unpack(buf, ETH_TYPE)
                if h[0] != ETHERTYPE_IPV4:
                    self._drop(Drop.NOT_IPV4, length)
                    continue
                results_in = sources.get(port_key | h[6])
                if results_in is None:
                    if guarded:
                        self._drop(Drop.SPOOFED_SOURCE, length)
                        continue
                    results_in = unlisted
                if h[7] not in aggregator:
                    if h[12] & FLAG_RESULT and not results_in and parses_qaina(h):
                        self._drop(Drop.FORGED_RESULT, length)
                    else:
                        self._forward(buf, length, h[7], h[4])
                else:
                    member = check(in_port, h)
                    if isinstance(member, int):
                        self._drop(member, length)
                    else:
                        self._aggregate(buf, payload, length, in_port, member, h)
            except Exception:  # counted as internal, the burst goes on
                self._internal_error(length)

    def source(self, in_port: int, src: int) -> int | None:
        """``source_guard`` and ``port_guard`` for a packet from ``src`` on ``in_port``:
        None if it is dropped (``spoofed_source``), else ``results_in`` (1 if RESULTs
        from ``src`` may come in on this port)."""
        results_in = self.sources.get(in_port << 32 | src)
        if results_in is None:
            return None if in_port in self.guarded else self.unlisted_results
        return results_in

    def check(self, in_port: int, h: tuple):
        """The checks of ``MyIngress`` for a packet to an aggregator address, in the
        program's order: the member tuple (see ``_contributor_index``) if it may
        touch the registers, else the drop reason. ``h`` is ``HEADERS`` of it."""
        (_, vihl, total_len, frag, _, proto, src, _, dport, udp_len,
         job_id, worker, flags, slot, ver, _, _) = h
        if (vihl & 0x0F != 5 or frag & FRAGMENT or proto != IP_PROTO_UDP
                or total_len != self.wire.ipv4_len or dport != QAINA_UDP_PORT
                or udp_len != self.wire.udp_len):
            return Drop.MALFORMED  # MyParser left qaina/payload invalid, or lengths
        if flags & FLAG_RESULT:  # only from the job's upper aggregator, on its port
            up = self._upstream.get(job_id, self._upstream_default)
            if up is None or in_port != up[0] or src != up[1] or ver > 1:
                return Drop.BAD_FLAGS
            return self._upper_result(job_id, slot, up)
        if ver > 1:
            return Drop.BAD_FLAGS
        member = self._contributors.get(job_id << 32 | src)
        if member is None:  # job_table miss, job out of range, or member_table miss
            job = self._jobs.get(job_id)
            if job is None:
                return Drop.UNKNOWN_JOB
            return Drop.NON_MEMBER if self._job_in_range(job) else Drop.BAD_JOB
        if in_port != member[1]:
            return Drop.WRONG_PORT
        if worker != member[0]:
            return Drop.BAD_WORKER
        if not member[4] <= slot < member[5]:
            return Drop.BAD_SLOT
        return member

    def _upper_result(self, job_id: int, slot: int, up: tuple):
        """The checks of ``job_table`` and the slot for a result from the upper
        aggregator: a member tuple whose worker is ``UPPER``, or the drop reason."""
        job = self._jobs.get(job_id)
        if job is None:
            return Drop.UNKNOWN_JOB
        if not self._job_in_range(job):
            return Drop.BAD_JOB
        job_index, n_workers, slot_base, slot_count, mcast_grp = job[:5]
        end = min(slot_base + slot_count, self.pool_slots)
        if not slot_base <= slot < end:
            return Drop.BAD_SLOT
        return (UPPER, up[0], 2 * job_index, n_workers, slot_base, end, mcast_grp, up,
                job[8] != 0)

    def _aggregate(self, buf, payload, length: int, in_port: int, member: tuple, h: tuple):
        """The register part of ``MyIngress.apply`` for an admitted contribution."""
        worker, _, cell, n_workers, _, _, group, up, shared = member
        slot, ver, exp = h[13], h[14], h[15]
        payload = payload[:self.words]
        # qaina.p4 indexes its registers with bit<32> arithmetic: slot + ver * POOL_SLOTS.
        copy, shadow = (slot + self.pool_slots, slot) if ver else (slot, slot + self.pool_slots)
        if shared:
            self._aggregate_shared(buf, payload, length, in_port, member, h, copy)
            return
        seen_cells, count_cells, exp_cells, cells = self._seen, self._count, self._exp, self.cells
        seen, count = seen_cells[copy], count_cells[copy]
        if self._owner[copy] != h[10]:  # another job's use: this job's starts afresh
            seen = count = 0
            self._owner[copy] = h[10]
        if worker == UPPER:
            self._take_upper_result(buf, payload, length, copy, seen, count, cell, group, h)
            return
        mask = 1 << worker
        if seen & mask:
            if count != 0:
                self._drop(Drop.DUPLICATE, length)
            elif up is not None and not self.agg_final[copy]:
                # No result from above yet: the sum goes up again (one was lost there).
                payload[:] = self._rows[copy]
                buf[_EXP] = exp_cells[copy] & 0xFF
                buf[_FLAGS] = FLAG_RETX
                self._partial_to_upstream(buf, up)
            else:  # a retransmission after the result went out: answer it
                payload[:] = self._rows[copy]
                self._result_to_sender(buf, in_port, cell, exp_cells[copy], length)
            return
        # First contribution of this worker to this use of the slot.
        seen_cells[copy] = seen | mask
        if seen_cells[shadow] & mask:
            seen_cells[shadow] ^= mask
        _count(cells["MyIngress.agg_packets"], cell, length)
        row = self._rows[copy]
        if count == 0:
            row[:] = payload
            exp_cells[copy] = exp
            self.agg_final[copy] = 0
            self.agg_seq[copy] = h[16]
            _count(cells["MyIngress.slots_opened"], cell, length)
        else:
            exp = self._add(row, payload, copy, exp)
        count = (count + 1) & 0xFF  # bit<8>
        if count != n_workers:
            count_cells[copy] = count
            return
        count_cells[copy] = 0
        _count(cells["MyIngress.slots_closed"], cell, length)
        payload[:] = row
        buf[_EXP] = exp & 0xFF
        if up is not None:  # the sum of the workers below goes up
            buf[_FLAGS] = 0
            self._partial_to_upstream(buf, up)
            return
        self._result_to_all(buf, cell, group)

    def _add(self, row, payload, copy: int, exp: int) -> int:
        """ADD_WORD over the payload and the exponent's maximum kept in the copy;
        returns the maximum (what the packet carries on)."""
        np.add(row, payload, row)
        stored = self._exp[copy]
        if stored > exp:
            return stored
        self._exp[copy] = exp
        return exp

    def _take_upper_result(self, buf, payload, length: int, copy: int, seen: int, count: int,
                           cell: int, group: int, h: tuple):
        """The upper aggregator's result for the use whose sum went up: stored (to
        answer retransmissions) and sent to every worker below; else STALE_RESULT."""
        if not (seen and count == 0 and not self.agg_final[copy]
                and self.agg_seq[copy] == h[16]):
            self._drop(Drop.STALE_RESULT, length)
            return
        self._rows[copy][:] = payload[:self.words]
        self._exp[copy] = h[15]
        self.agg_final[copy] = 1
        self._result_to_all(buf, cell, group)

    def _partial_to_upstream(self, buf, up: tuple | None):
        """``partial_to_upstream``: out to the upper aggregator as this switch's
        contribution."""
        buf[_WORKER] = (up or NO_UPSTREAM)[3]
        self._to_upstream(buf, up)

    def _to_upstream(self, buf, up: tuple | None):
        """Out of the upstream port, from this aggregator to the upstream's address.
        A shared job with no ``upstream_table`` entry has the metadata's zeros, as in
        the program: port 0, address 0.0.0.0 (a switch without a port 0 drops it)."""
        port, addr, mac, _ = up or NO_UPSTREAM
        buf[ETH_SRC] = buf[ETH_DST]
        buf[ETH_DST] = mac
        buf[IP_SRC] = buf[IP_DST]
        _ADDR.pack_into(buf, IP_DST.start, addr)
        buf[IP_TTL] = RESULT_TTL
        buf[UDP_CSUM] = b"\0\0"
        _CHECKSUM.pack_into(buf, IP_CSUM, ipv4_checksum(buf))
        if self.pre.pending:  # frames leave in the order their packets caused them
            self.pre.flush()
        self.tx(port, buf[:self.frame_len])

    def _result_to_all(self, buf, cell: int, group: int):
        """``result_to_all``: the sum in ``buf`` leaves from the aggregator's MAC and
        address to the job's multicast group."""
        buf[_FLAGS] = FLAG_RESULT
        buf[ETH_SRC] = buf[ETH_DST]
        buf[IP_SRC] = buf[IP_DST]
        buf[IP_TTL] = RESULT_TTL
        buf[UDP_CSUM] = b"\0\0"
        self.pre.pending.append((buf, cell, group))

    def _result_to_sender(self, buf, in_port: int, cell: int, exp: int, length: int):
        """``result_to_sender``: the stored result in ``buf``'s payload goes back to
        where the retransmission came from."""
        _count(self.cells["MyIngress.retx_answered"], cell, length)
        mac = bytes(buf[ETH_DST])
        buf[ETH_DST] = buf[ETH_SRC]
        buf[ETH_SRC] = mac
        ip = bytes(buf[IP_DST])
        buf[IP_DST] = buf[IP_SRC]
        buf[IP_SRC] = ip
        buf[IP_TTL] = RESULT_TTL
        buf[UDP_CSUM] = b"\0\0"
        buf[_FLAGS] = FLAG_RESULT | FLAG_RETX
        buf[_EXP] = exp & 0xFF
        _CHECKSUM.pack_into(buf, IP_CSUM, ipv4_checksum(buf))
        self.pre.count(cell, 1)
        if self.pre.pending:  # frames leave in the order their packets caused them
            self.pre.flush()
        self.tx(in_port, buf[:self.frame_len])

    def _process_short(self, in_port: int, buf, length: int):
        """A frame shorter than an aggregation packet: IPv4 to forward, or a drop."""
        if length < IP_DST.stop or buf[ETH_TYPE] != 0x08 or buf[ETH_TYPE + 1] != 0x00:
            self._drop(Drop.NOT_IPV4, length)
            return
        results_in = self.source(in_port, _ADDR.unpack_from(buf, IP_SRC.start)[0])
        if results_in is None:
            self._drop(Drop.SPOOFED_SOURCE, length)
            return
        dst = _ADDR.unpack_from(buf, IP_DST.start)[0]
        if dst in self.aggregator:  # too short for Ethernet/IPv4/UDP/QAINA/payload
            self._drop(Drop.MALFORMED, length)
            return
        # MyParser extracts the QAINA header of a frame too short for the payload (the
        # payload's extract fails, what came before stays valid).
        if (not results_in and length >= PAYLOAD_OFFSET and buf[_FLAGS] & FLAG_RESULT
                and buf[IP_VIHL] & 0x0F == 5 and buf[IP_PROTO] == IP_PROTO_UDP
                and not _SHORT.unpack_from(buf, IP_FLAGS_FRAG)[0] & FRAGMENT
                and _SHORT.unpack_from(buf, UDP_DPORT)[0] == QAINA_UDP_PORT):
            self._drop(Drop.FORGED_RESULT, length)
            return
        self._forward(buf, length, dst, buf[IP_TTL])

    def _internal_error(self, length: int, packets: int = 1):
        """Processing failed (a bug): count the packets under ``INTERNAL``, log why."""
        d = self.cells["MyIngress.drops"]
        d[2 * Drop.INTERNAL] += packets
        d[2 * Drop.INTERNAL + 1] += length
        self.internal_errors += 1
        if self.internal_errors <= 10 or self.internal_errors % 1000 == 0:
            log.exception("internal error #%d while processing a packet", self.internal_errors)

    def _drop(self, reason: int, length: int):
        d = self.cells["MyIngress.drops"]
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
        """ipv4_lpm: forward with the TTL decremented, or drop (a TTL of 0 or 1, no
        route). The checksum is recomputed, or for a header with options updated for
        the decrement (RFC 1624, eqn. 3), as the program does."""
        if ttl <= 1:
            self._drop(Drop.TTL_EXPIRED, length)
            return
        port = self._route(dst)
        if port is None:
            self._drop(Drop.NO_ROUTE, length)
            return
        if self.pre.pending:  # frames leave in the order their packets caused them
            self.pre.flush()
        buf[IP_TTL] = ttl - 1
        if buf[IP_VIHL] & 0x0F == 5:
            checksum = ipv4_checksum(buf)
        else:
            s = (~_CHECKSUM.unpack_from(buf, IP_CSUM)[0] & 0xFFFF) + 0xFEFF
            checksum = ~((s & 0xFFFF) + (s >> 16)) & 0xFFFF
        _CHECKSUM.pack_into(buf, IP_CSUM, checksum)
        self.tx(port, buf[:length])

