"""The ``qaina.p4`` pipeline in software: parser, ingress, PRE, egress, deparser.

``Pipeline.process(port, buf, length)`` runs one received frame through the same
steps as ``qaina.p4`` on BMv2 and hands every frame it sends to ``tx(port, frame)``.
State lives in the objects the P4 program declares, named by its P4Info: tables
(``Table``), registers and counters (numpy arrays) and multicast groups. Table
writes arrive from the P4Runtime server (``runtime.py``) through ``Table``.
"""

from __future__ import annotations

import logging
import struct

import numpy as np

from ..header import (FLAG_RESULT, FLAG_RETX, IPV4_TOTAL_LEN, QAINA_OFFSET, QAINA_STRUCT,
                      QAINA_UDP_PORT, QAINA_WORDS, UDP_TOTAL_LEN, PAYLOAD_OFFSET, FRAME_LEN)
from ..p4info import ActionInfo, P4Info, TableInfo

log = logging.getLogger("qaina.switch")

# Indexes of MyIngress.drops, as qaina.p4 declares them (tests/test_p4info.py checks).
DROP_NOT_IPV4 = 0
DROP_NO_ROUTE = 1
DROP_MALFORMED = 2
DROP_BAD_FLAGS = 3
DROP_UNKNOWN_JOB = 4
DROP_NON_MEMBER = 5
DROP_BAD_WORKER = 6
DROP_BAD_SLOT = 7
DROP_DUPLICATE = 8
DROP_REASONS = {v: k[5:].lower() for k, v in dict(globals()).items() if k.startswith("DROP_")}

RESULT_TTL = 64
NO_ACTION = "NoAction"
_MISS = object()

_IPV4 = struct.Struct("!BBHHHBBH4s4s")  # ipv4 header, addresses as bytes
_IPV4_WORDS = struct.Struct("!10H")
_UDP = struct.Struct("!HHHH")
_ADDR = struct.Struct("!I")


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

    def __init__(self, p4info: P4Info, tx=None):
        self.p4info = p4info
        self.tx = tx or (lambda port, frame: None)
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
        self._aggregator: set[bytes] = set()
        self._jobs: dict[int, tuple] = {}
        self._members: dict[tuple, int] = {}
        self._rewrite: dict[int, tuple] = {}
        for table in self.tables.values():
            table.listeners.append(self._rebuild)
            self._rebuild(table)

        self._bind_fast_views()
        self.rx_frame = bytearray(2048)
        self._payload = np.ndarray((QAINA_WORDS,), dtype=">u4", buffer=self.rx_frame,
                                   offset=PAYLOAD_OFFSET)

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
            self._aggregator = {_ADDR.pack(ip) for (ip,), (action, _) in table.entries.items()}
        elif name == "MyIngress.job_table":
            self._jobs = {job: params for (job,), (action, params) in table.entries.items()
                          if action == "MyIngress.set_job"}
        elif name == "MyIngress.member_table":
            self._members = {(job, _ADDR.pack(ip)): params[0]
                             for (job, ip), (action, params) in table.entries.items()
                             if action == "MyIngress.set_member"}
        elif name == "MyEgress.result_rewrite":
            self._rewrite = {rid: (params[0].to_bytes(6, "big"), _ADDR.pack(params[1]), params[2])
                             for (rid,), (action, params) in table.entries.items()
                             if action == "MyEgress.to_worker"}

    def reset_state(self):
        """Registers and counters back to zero (a new pipeline config)."""
        for arr in (self.agg_sum, self.agg_seen, self.agg_count, self.agg_exp):
            arr[...] = 0
        for arr in self.counters.values():
            arr[...] = 0
        for table in self.tables.values():
            table.entries.clear()
            table._changed()
        self.mcast_groups.clear()

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

    def process(self, in_port: int, buf: bytearray, length: int):
        """Run one frame of ``length`` bytes in ``buf`` (modified in place)."""
        if length < 34 or buf[12] != 0x08 or buf[13] != 0x00:
            self._drop(DROP_NOT_IPV4, length)
            return
        vihl, _, total_len, _, frag, ttl, proto, _, src, dst = _IPV4.unpack_from(buf, 14)
        if dst not in self._aggregator:
            port = self._route(int.from_bytes(dst, "big"))
            if port is None:
                self._drop(DROP_NO_ROUTE, length)
                return
            buf[22] = (ttl - 1) & 0xFF
            struct.pack_into("!H", buf, 24, ipv4_checksum(buf))
            self.tx(port, memoryview(buf)[:length])
            return

        # Addressed to this aggregator: parse the rest as the P4 parser does.
        if (length < FRAME_LEN or vihl & 0x0F != 5 or frag & 0x1FFF or proto != 17
                or total_len != IPV4_TOTAL_LEN):
            self._drop(DROP_MALFORMED, length)
            return
        _, dport, udp_len, _ = _UDP.unpack_from(buf, 34)
        if dport != QAINA_UDP_PORT or udp_len != UDP_TOTAL_LEN:
            self._drop(DROP_MALFORMED, length)
            return
        job_id, worker, flags, slot, ver, exp, seq = QAINA_STRUCT.unpack_from(buf, QAINA_OFFSET)
        if flags & FLAG_RESULT or ver > 1:
            self._drop(DROP_BAD_FLAGS, length)
            return
        job = self._jobs.get(job_id)
        if job is None:
            self._drop(DROP_UNKNOWN_JOB, length)
            return
        member = self._members.get((job_id, src))
        if member is None:
            self._drop(DROP_NON_MEMBER, length)
            return
        job_index, n_workers, slot_base, slot_count, mcast_grp = job[:5]
        if worker != member or worker >= n_workers:
            self._drop(DROP_BAD_WORKER, length)
            return
        if slot < slot_base or slot - slot_base >= slot_count or slot >= self.pool_slots:
            self._drop(DROP_BAD_SLOT, length)
            return
        # qaina.p4 indexes its registers with bit<32> arithmetic: slot + ver * POOL_SLOTS.
        copy = ver * self.pool_slots + slot
        shadow = (1 - ver) * self.pool_slots + slot
        mask = 1 << worker
        seen_cells, count_cells = self._seen, self._count
        seen = seen_cells[copy]
        count = count_cells[copy]
        j = 2 * job_index
        if not seen & mask:
            seen_cells[copy] = seen | mask
            seen_cells[shadow] &= ~mask & 0xFFFFFFFF
            c = self._c_agg
            c[j] += 1
            c[j + 1] += length
            row = self._rows[copy]
            if count == 0:
                row[:] = self._payload
                self._exp[copy] = exp
                c = self._c_opened
                c[j] += 1
                c[j + 1] += length
            else:
                np.add(row, self._payload, out=row, casting="unsafe")
                stored = self._exp[copy]
                if stored > exp:
                    exp = stored
                else:
                    self._exp[copy] = exp
            count += 1
            if count == n_workers:
                count = 0
            count_cells[copy] = count
            if count:
                return
            c = self._c_closed
            c[j] += 1
            c[j + 1] += length
            self._payload[:] = row
            self._result_to_all(buf, job_index, mcast_grp, job_id, slot, ver, exp, seq)
        elif count == 0:
            self._payload[:] = self._rows[copy]
            c = self._c_retx
            c[j] += 1
            c[j + 1] += length
            self._result_to_sender(buf, in_port, job_index, job_id, worker, slot, ver,
                                   self._exp[copy], seq)
        else:
            self._drop(DROP_DUPLICATE, length)

    def _result_header(self, buf, job_id, worker, flags, slot, ver, exp, seq):
        buf[22] = RESULT_TTL
        buf[40] = buf[41] = 0  # udp checksum
        QAINA_STRUCT.pack_into(buf, QAINA_OFFSET, job_id, worker, flags, slot, ver, exp, seq)

    def _result_to_all(self, buf, job_index, mcast_grp, job_id, slot, ver, exp, seq):
        replicas = self.mcast_groups.get(mcast_grp, ())
        buf[6:12] = buf[0:6]  # from the aggregator's MAC ...
        buf[26:30] = buf[30:34]  # ... and address
        sender = (bytes(buf[0:6]), bytes(buf[30:34]), buf[QAINA_OFFSET + 2])
        self._result_header(buf, job_id, sender[2], FLAG_RESULT, slot, ver, exp, seq)
        # Replicas differ only in destination MAC, address and worker: the IPv4
        # checksum is the sum of the rest plus the destination's two 16-bit halves.
        words = _IPV4_WORDS.unpack_from(buf, 14)
        rest = sum(words) - words[5] - words[8] - words[9]
        frame = memoryview(buf)[:FRAME_LEN]
        tx, rewrites = self.tx, self._rewrite
        for port, rid in replicas:
            # Every replica leaves the PRE as ingress left it; egress rewrites its copy.
            mac, ip, worker = (rid and rewrites.get(rid)) or sender
            buf[0:6] = mac
            buf[30:34] = ip
            buf[QAINA_OFFSET + 2] = worker
            c = rest + (ip[0] << 8 | ip[1]) + (ip[2] << 8 | ip[3])
            c = (c & 0xFFFF) + (c >> 16)
            c = ~((c & 0xFFFF) + (c >> 16)) & 0xFFFF
            buf[24] = c >> 8
            buf[25] = c & 0xFF
            tx(port, frame)
        if replicas:
            c = self._c_results
            c[2 * job_index] += len(replicas)
            c[2 * job_index + 1] += len(replicas) * FRAME_LEN

    def _result_to_sender(self, buf, in_port, job_index, job_id, worker, slot, ver, exp, seq):
        mac = bytes(buf[0:6])
        buf[0:6] = buf[6:12]
        buf[6:12] = mac
        ip = bytes(buf[30:34])
        buf[30:34] = buf[26:30]
        buf[26:30] = ip
        self._result_header(buf, job_id, worker, FLAG_RESULT | FLAG_RETX, slot, ver, exp, seq)
        struct.pack_into("!H", buf, 24, ipv4_checksum(buf))
        c = self._c_results
        c[2 * job_index] += 1
        c[2 * job_index + 1] += FRAME_LEN
        self.tx(in_port, memoryview(buf)[:FRAME_LEN])
