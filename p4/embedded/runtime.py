"""P4Runtime server of the embedded switch.

Serves the subset of P4Runtime that the harness and ``p4runtime-shell`` use:
StreamChannel arbitration (``streams.py``: the spec's rules, the highest election id
ever seen is primary, a live election id cannot be taken twice; at most
``MAX_STREAMS`` streams, each arbitrated in time and read by its client),
Capabilities, Set/GetForwardingPipelineConfig (the P4Info must be that of
``qaina.p4``; device config bytes are ignored; VERIFY_AND_COMMIT starts a fresh
pipeline, RECONCILE_AND_COMMIT keeps the state), Write of table entries (insert /
modify / delete, default entries), multicast groups and counter cells, each update
checked as the spec says (``updates.py``), every update of a batch attempted and its
error reported per update, Read of table entries, multicast
groups, counter entries and register entries. Anything else is answered with a gRPC
status (UNIMPLEMENTED, INVALID_ARGUMENT, ...), never a crash.
"""

from __future__ import annotations

import errno
import logging
import socket
import threading
from concurrent import futures

import grpc
import numpy as np

from .. import program
from ..header import PAYLOAD_WORDS
from ..p4info import P4Info, decode, difference, encode
from ..proto import code_pb2, p4runtime_pb2, p4runtime_pb2_grpc, status_pb2
from .absent import read_absent
from .logfilter import Sparing
from .pipeline import Pipeline, PipelineError
from .streams import MAX_STREAMS, StreamChannels, election_of
from .updates import (GROUP_BITS, MAX_ALL_REPLICAS, PRIORITY_MATCHES, check_entry,
                      match_key, replicas, table_action)

log = logging.getLogger("qaina.switch.p4runtime")

API_VERSION = "1.4.1"
#: server threads left for unary RPCs (Write, Read, ...) when every stream is open
UNARY_THREADS = 8
_UPDATE = p4runtime_pb2.Update
_ACTION = p4runtime_pb2.SetForwardingPipelineConfigRequest
_ATOMICITY = p4runtime_pb2.WriteRequest
_STATUS_DETAILS = "grpc-status-details-bin"


def _abort(context, code: str, message: str):
    context.abort(getattr(grpc.StatusCode, code), message)


READ_PART = 32768  # entities per ReadResponse (a register cell takes about 20 bytes)
READ_MAX = 1 << 20  # entities in one Read: twice all cells of the largest build (536,688)


class ReadParts:
    """The ReadResponses of one Read, filled in order, at most ``READ_PART`` entities
    each: a whole ``agg_sum`` of a large build is more than gRPC's 4 MB message."""

    def __init__(self):
        self.parts = [p4runtime_pb2.ReadResponse()]
        self._room = READ_PART
        self.count = 0  # entities so far, and those reserved

    def reserve(self, n: int):
        """Room for ``n`` more entities, or RESOURCE_EXHAUSTED past ``READ_MAX``."""
        if self.count + n > READ_MAX:
            raise PipelineError("RESOURCE_EXHAUSTED", f"the Read asks for more than {READ_MAX} "
                                "entities: read fewer at a time")

    def add(self):
        """A new entity at the end of the answer."""
        self.count += 1
        if not self._room:
            self.parts.append(p4runtime_pb2.ReadResponse())
            self._room = READ_PART
        self._room -= 1
        return self.parts[-1].entities.add()


class Device:
    """One switch as P4Runtime sees it: device id, pipeline config, clients."""

    def __init__(self, device_id: int, make_pipeline, p4info: P4Info | None = None):
        self.device_id = device_id
        self.make_pipeline = make_pipeline  # P4Info -> Pipeline (installed in the switch)
        #: the programs this device runs: the builds of qaina.p4 (or the one given)
        self.programs = ([p4info] if p4info is not None else
                         [program.p4info(w) for w in PAYLOAD_WORDS])
        self.pipeline: Pipeline | None = None
        self.config = None  # ForwardingPipelineConfig as last set
        self.lock = threading.RLock()
        self.primary: tuple[int, int] | None = None  # election id of the primary, if any
        self.highest: tuple[int, int] | None = None  # highest election id ever seen
        self.streams: dict[int, tuple] = {}  # stream key -> (election id or None, Outbox)
        self.open_streams = 0  # StreamChannel calls in progress, arbitrated or not


class P4RuntimeServicer(StreamChannels, p4runtime_pb2_grpc.P4RuntimeServicer):
    """The gRPC servicer; all state it changes belongs to ``Device``. Its StreamChannel
    (arbitration) is ``streams.py``'s."""

    def __init__(self, device: Device):
        self.device = device

    # -- helpers -----------------------------------------------------------------------
    def _check_device(self, device_id, context):
        if device_id != self.device.device_id:
            _abort(context, "NOT_FOUND", f"no device {device_id} here "
                   f"(this switch is device {self.device.device_id})")

    def _check_primary(self, request, context):
        if request.role or request.role_id:
            role = request.role or f"id {request.role_id}"
            _abort(context, "PERMISSION_DENIED", f"no client is primary for role {role!r}: "
                   "this switch knows only the default role (leave role unset)")
        if (self.device.primary is None
                or election_of(request.election_id) != self.device.primary):
            _abort(context, "PERMISSION_DENIED", "only the primary client may write; "
                   "open a StreamChannel with the highest election id first")

    def _pipeline(self, context) -> Pipeline:
        if self.device.pipeline is None:
            _abort(context, "FAILED_PRECONDITION",
                   "no forwarding pipeline config set (SetForwardingPipelineConfig first)")
        return self.device.pipeline

    # -- RPCs --------------------------------------------------------------------------
    def Capabilities(self, request, context):
        return p4runtime_pb2.CapabilitiesResponse(p4runtime_api_version=API_VERSION)

    def SetForwardingPipelineConfig(self, request, context):
        self._check_device(request.device_id, context)
        action = request.action
        if action == _ACTION.UNSPECIFIED:
            _abort(context, "INVALID_ARGUMENT", "action must be set")
        if action not in _ACTION.Action.values():
            _abort(context, "INVALID_ARGUMENT", f"action {action} is not one of the spec's")
        if action in (_ACTION.VERIFY_AND_SAVE, _ACTION.COMMIT):
            _abort(context, "UNIMPLEMENTED",
                   "use VERIFY_AND_COMMIT, RECONCILE_AND_COMMIT or VERIFY")
        self._check_primary(request, context)
        if not request.HasField("config"):
            _abort(context, "INVALID_ARGUMENT", "no config given")
        info = self._program(request.config.p4info, context)
        if action == _ACTION.VERIFY:
            return p4runtime_pb2.SetForwardingPipelineConfigResponse()
        with self.device.lock:
            pipeline = self.device.pipeline
            if (action == _ACTION.VERIFY_AND_COMMIT or pipeline is None
                    or pipeline.p4info is not info):
                # A fresh pipeline: empty tables and groups, zero registers and counters
                # (another build's registers cannot be reconciled: it is fresh too).
                self.device.pipeline = self.device.make_pipeline(info)
            self.device.config = p4runtime_pb2.ForwardingPipelineConfig()
            self.device.config.CopyFrom(request.config)
        log.info("pipeline config set (%s, cookie %d)", _ACTION.Action.Name(action),
                 request.config.cookie.cookie)
        return p4runtime_pb2.SetForwardingPipelineConfigResponse()

    def _program(self, given, context) -> P4Info:
        """The program of the device whose P4Info is ``given``; INVALID_ARGUMENT if none."""
        for info in self.device.programs:
            if info.proto == given:
                return info
        why = difference(self.device.programs[0].proto, given)
        _abort(context, "INVALID_ARGUMENT",
               "this embedded switch runs the builds of qaina.p4 only (payload words "
               f"{', '.join(map(str, PAYLOAD_WORDS))}); the P4Info is none of them: {why}")

    def GetForwardingPipelineConfig(self, request, context):
        self._check_device(request.device_id, context)
        if self.device.config is None:
            _abort(context, "FAILED_PRECONDITION", "no forwarding pipeline config set")
        resp = p4runtime_pb2.GetForwardingPipelineConfigResponse()
        kind = request.response_type
        R = p4runtime_pb2.GetForwardingPipelineConfigRequest
        if kind not in R.ResponseType.values():
            _abort(context, "INVALID_ARGUMENT", f"response_type {kind} is not one of the "
                   "spec's (ALL, COOKIE_ONLY, P4INFO_AND_COOKIE, DEVICE_CONFIG_AND_COOKIE)")
        if kind in (R.ALL, R.P4INFO_AND_COOKIE):
            resp.config.p4info.CopyFrom(self.device.config.p4info)
        if kind in (R.ALL, R.DEVICE_CONFIG_AND_COOKIE):
            resp.config.p4_device_config = self.device.config.p4_device_config
        resp.config.cookie.CopyFrom(self.device.config.cookie)
        return resp

    def Write(self, request, context):
        """Every update is attempted (CONTINUE_ON_ERROR); if any fails, the status is
        UNKNOWN with one p4.v1.Error per update, in order, in its details."""
        self._check_device(request.device_id, context)
        self._check_primary(request, context)
        pipeline = self._pipeline(context)
        if request.atomicity not in _ATOMICITY.Atomicity.values():
            _abort(context, "INVALID_ARGUMENT", f"atomicity {request.atomicity} is none of "
                   "the spec's")
        if request.atomicity != _ATOMICITY.CONTINUE_ON_ERROR:
            _abort(context, "UNIMPLEMENTED", "only CONTINUE_ON_ERROR batches are supported")
        errors = []
        with self.device.lock:
            tables = list(pipeline.tables.values())
            for table in tables:  # lookups rebuilt once per changed table, not per update
                table.defer()
            try:
                self._write_all(pipeline, request.updates, errors)
            finally:
                for table in tables:
                    table.flush()
        failed = [e for e in errors if e.canonical_code != code_pb2.OK]
        if failed:
            message = (f"{len(failed)} of {len(errors)} updates failed; first: "
                       f"{code_pb2.Code.Name(failed[0].canonical_code)}: {failed[0].message}")
            status = status_pb2.Status(code=code_pb2.UNKNOWN, message=message)
            for e in errors:
                status.details.add().Pack(e)
            context.set_trailing_metadata(((_STATUS_DETAILS, status.SerializeToString()),))
            context.abort(grpc.StatusCode.UNKNOWN, message)
        return p4runtime_pb2.WriteResponse()

    def _write_all(self, pipeline: Pipeline, updates, errors: list):
        """Attempt every update in order; one ``p4.v1.Error`` each into ``errors``."""
        for update in updates:
            error = p4runtime_pb2.Error(canonical_code=code_pb2.OK)
            try:
                self._write_one(pipeline, update)
            except PipelineError as exc:
                error.canonical_code = getattr(code_pb2, exc.code)
                error.message = str(exc)
            except (KeyError, ValueError) as exc:
                error.canonical_code = code_pb2.INVALID_ARGUMENT
                error.message = str(exc)
            errors.append(error)

    def _write_one(self, pipeline: Pipeline, update):
        entity = update.entity
        kind = entity.WhichOneof("entity")
        if update.type == _UPDATE.UNSPECIFIED:
            raise PipelineError("INVALID_ARGUMENT", "update type must be set")
        if update.type not in (_UPDATE.INSERT, _UPDATE.MODIFY, _UPDATE.DELETE):
            raise PipelineError("INVALID_ARGUMENT", f"update type {update.type} is none of "
                                "INSERT, MODIFY and DELETE")
        if kind == "table_entry":
            self._write_table(pipeline, update.type, entity.table_entry)
        elif kind == "packet_replication_engine_entry":
            pre = entity.packet_replication_engine_entry
            if pre.WhichOneof("type") != "multicast_group_entry":
                raise PipelineError("UNIMPLEMENTED", "only multicast groups are supported")
            self._write_mcast(pipeline, update.type, pre.multicast_group_entry)
        elif kind == "counter_entry":
            self._write_counter(pipeline, update.type, entity.counter_entry)
        elif kind == "register_entry":
            self._write_register(pipeline, update.type, entity.register_entry)
        elif kind in ("direct_counter_entry", "direct_meter_entry"):
            raise PipelineError("INVALID_ARGUMENT",
                                f"{kind}: no table of this program has a direct resource")
        elif kind is None:
            raise PipelineError("INVALID_ARGUMENT", "the update has no entity")
        else:
            raise PipelineError("UNIMPLEMENTED", f"writing {kind} is not supported")

    @staticmethod
    def _write_register(pipeline, kind, entry):
        """MODIFY sets one cell (``index`` given) or every cell of a register array to
        ``data`` (a bitstring); INSERT and DELETE are INVALID_ARGUMENT (spec,
        "Register Entry")."""
        if kind != _UPDATE.MODIFY:
            raise PipelineError("INVALID_ARGUMENT", "a register entry can only be modified")
        info = pipeline.p4info.registers.get(entry.register_id)
        if info is None:
            raise PipelineError("INVALID_ARGUMENT",
                                f"no register with id {entry.register_id} in the P4Info")
        if entry.data.WhichOneof("data") != "bitstring" or not entry.data.bitstring:
            raise PipelineError("INVALID_ARGUMENT",
                                f"{info.name}: the data must be a non-empty bitstring")
        value = decode(entry.data.bitstring, info.bitwidth)
        cells = _cells(entry, info, "register")
        pipeline.registers[info.name][cells] = value

    def _table(self, pipeline: Pipeline, table_id: int):
        table = pipeline.tables.get(table_id)
        if table is None:
            raise PipelineError("INVALID_ARGUMENT", f"no table with id {table_id} in the P4Info")
        return table

    def _write_table(self, pipeline, kind, entry):
        """A table entry update as the spec's "Table Entry" section says: the key
        checked on every update, the action on INSERT and MODIFY only (DELETE ignores
        it), a MODIFY without an action a no-op, the default entry modified only."""
        table = self._table(pipeline, entry.table_id)
        check_entry(table.info, entry)
        actions = pipeline.p4info.actions
        if entry.is_default_action:
            if kind != _UPDATE.MODIFY:
                raise PipelineError("INVALID_ARGUMENT", "the default entry can only be modified")
            if len(entry.match) or entry.priority:
                raise PipelineError("INVALID_ARGUMENT",
                                    "the default entry has no match fields and no priority")
            action = table_action(table.info, actions, entry)
            if action is None:
                table.reset_default()
            else:
                table.set_default(*action)
            table.set_cookie(None, entry.controller_metadata, entry.metadata)  # None: default
            return
        key = match_key(table.info, entry)
        if kind == _UPDATE.DELETE:
            table.delete(key)
            return
        action = table_action(table.info, actions, entry)
        if kind == _UPDATE.INSERT:
            if action is None:
                raise PipelineError("INVALID_ARGUMENT", "an INSERT needs an action")
            table.insert(key, *action)
        elif action is None:  # a MODIFY that keeps the action
            if key not in table.entries:
                raise PipelineError("NOT_FOUND", f"{table.name}: no entry {key}")
        else:
            table.modify(key, *action)
        table.set_cookie(key, entry.controller_metadata, entry.metadata)

    @staticmethod
    def _write_mcast(pipeline, kind, group):
        gid = group.multicast_group_id
        if gid == 0:
            raise PipelineError("INVALID_ARGUMENT", "multicast group id 0 is reserved")
        if gid >> GROUP_BITS:
            raise PipelineError("OUT_OF_RANGE", f"multicast group id {gid} exceeds "
                                f"{GROUP_BITS} bits (v1model's mcast_grp)")
        exists = gid in pipeline.mcast_groups
        if kind == _UPDATE.DELETE:
            if not exists:
                raise PipelineError("NOT_FOUND", f"no multicast group {gid}")
            pipeline.mcast_replicas -= len(pipeline.mcast_groups.pop(gid))
            return
        copies = replicas(group)
        if kind == _UPDATE.INSERT:
            if exists:
                raise PipelineError("ALREADY_EXISTS", f"multicast group {gid} exists")
        elif not exists:
            raise PipelineError("NOT_FOUND", f"no multicast group {gid}")
        held = pipeline.mcast_replicas - len(pipeline.mcast_groups.get(gid, ()))
        if held + len(copies) > MAX_ALL_REPLICAS:
            raise PipelineError("RESOURCE_EXHAUSTED", f"multicast group {gid}: this switch "
                                f"holds at most {MAX_ALL_REPLICAS} replicas in all "
                                f"groups ({held} held)")
        pipeline.mcast_groups[gid] = copies
        pipeline.mcast_replicas = held + len(copies)

    @staticmethod
    def _write_counter(pipeline, kind, entry):
        """MODIFY sets one cell (``index`` given) or every cell of a counter array to
        ``data``; INSERT and DELETE are INVALID_ARGUMENT (spec, "Counter Entry")."""
        if kind != _UPDATE.MODIFY:
            raise PipelineError("INVALID_ARGUMENT", "a counter entry can only be modified")
        info = pipeline.p4info.counters.get(entry.counter_id)
        if info is None:
            raise PipelineError("INVALID_ARGUMENT",
                                f"no counter with id {entry.counter_id} in the P4Info")
        cells = _cells(entry, info, "counter")
        if entry.data.packet_count < 0 or entry.data.byte_count < 0:
            raise PipelineError("INVALID_ARGUMENT", "a counter's packet and byte counts "
                                "cannot be negative")
        if entry.HasField("data"):
            pipeline.counters[info.name][cells] = (entry.data.packet_count,
                                                   entry.data.byte_count)

    # -- Read --------------------------------------------------------------------------
    def Read(self, request, context):
        self._check_device(request.device_id, context)
        pipeline = self._pipeline(context)
        out = ReadParts()
        with self.device.lock:
            wanted = sum(self._entities(pipeline, entity) for entity in request.entities)
            if wanted > READ_MAX:  # said before any of it is built
                _abort(context, "RESOURCE_EXHAUSTED", f"the Read asks for {wanted} entities, "
                       f"more than {READ_MAX}: read fewer at a time")
            for entity in request.entities:
                kind = entity.WhichOneof("entity")
                try:
                    if kind is None:
                        raise PipelineError("INVALID_ARGUMENT", "an entity to read is empty")
                    reader = getattr(self, "_read_" + kind, None) or read_absent(kind)
                    reader(pipeline, getattr(entity, kind), out)
                except PipelineError as exc:
                    _abort(context, exc.code, str(exc))
        yield from out.parts

    def _entities(self, pipeline, entity) -> int:
        """How many entities reading ``entity`` gives at most (0 for an entity the
        Read refuses: it says why)."""
        kind = entity.WhichOneof("entity")
        try:
            if kind == "table_entry":
                q = entity.table_entry
                tables = (pipeline.tables.values() if q.table_id == 0
                          else [self._table(pipeline, q.table_id)])
                if q.is_default_action or len(q.match):
                    return len(tables)
                return sum(len(t.entries) for t in tables)
            if kind == "packet_replication_engine_entry":
                return sum(1 + len(c) for c in pipeline.mcast_groups.values())
            if kind in ("counter_entry", "register_entry"):
                q = getattr(entity, kind)
                counter = kind == "counter_entry"
                infos = pipeline.p4info.counters if counter else pipeline.p4info.registers
                arrays = self._arrays(pipeline.counters if counter else pipeline.registers,
                                      q.counter_id if counter else q.register_id, kind, infos)
                return sum(1 if q.HasField("index") else info.size for info, _ in arrays)
        except PipelineError:
            pass
        return 0

    def _read_table_entry(self, pipeline, query, out: ReadParts):
        if len(query.match) and query.table_id == 0:  # match fields filter one table
            raise PipelineError("INVALID_ARGUMENT", "a Read with match fields needs a table id")
        tables = (pipeline.tables.values() if query.table_id == 0
                  else [self._table(pipeline, query.table_id)])
        for table in tables:
            if query.is_default_action:
                out.reserve(1)
                e = self._emit_table_entry(out, table, None, table.default)
                if None in table.cookies:
                    e.controller_metadata, e.metadata = table.cookies[None]
                continue
            entries = table.entries.items()
            if len(query.match):  # one entry, by its key (as a write gives it)
                if query.priority and not any(mf.match_type in PRIORITY_MATCHES
                                              for mf in table.info.match_fields):
                    raise PipelineError("INVALID_ARGUMENT", f"{table.name}: priority "
                                        f"{query.priority} given, but the table has no "
                                        "ternary, range or optional field")
                key = match_key(table.info, query)
                entries = [(key, table.entries[key])] if key in table.entries else []
            out.reserve(len(entries))
            for key, action in entries:
                e = self._emit_table_entry(out, table, key, action)
                if key in table.cookies:
                    e.controller_metadata, e.metadata = table.cookies[key]

    def _emit_table_entry(self, out: ReadParts, table, key, action):
        e = out.add().table_entry
        e.table_id = table.info.id
        if key is None:
            e.is_default_action = True
        else:
            for mf, value in zip(table.info.match_fields, key):
                m = e.match.add()
                m.field_id = mf.id
                if mf.match_type == "LPM":
                    if value[1] == 0:  # a wildcard LPM field is omitted
                        e.match.pop()
                        continue
                    m.lpm.value = encode(value[0], mf.bitwidth)
                    m.lpm.prefix_len = value[1]
                else:
                    m.exact.value = encode(value, mf.bitwidth)
        name, params = action
        ainfo = self.device.pipeline.p4info.action(name)
        e.action.action.action_id = ainfo.id
        for p, v in zip(ainfo.params, params):
            ap = e.action.action.params.add()
            ap.param_id = p.id
            ap.value = encode(v, p.bitwidth)
        return e

    def _read_packet_replication_engine_entry(self, pipeline, query, out: ReadParts):
        if query.WhichOneof("type") != "multicast_group_entry":
            raise PipelineError("UNIMPLEMENTED", "only multicast groups are supported")
        gid = query.multicast_group_entry.multicast_group_id
        groups = pipeline.mcast_groups
        if gid != 0:
            groups = {gid: groups[gid]} if gid in groups else {}
        out.reserve(sum(1 + len(copies) for copies in groups.values()))  # replicas too
        for g, copies in sorted(groups.items()):
            m = out.add().packet_replication_engine_entry.multicast_group_entry
            m.multicast_group_id = g
            for port, rid in copies:
                r = m.replicas.add()
                r.egress_port = port
                r.instance = rid

    def _arrays(self, kinds: dict, array_id: int, what: str, p4info_kind):
        if array_id == 0:
            return [(p4info_kind[i], kinds[p4info_kind[i].name]) for i in sorted(p4info_kind)]
        if array_id not in p4info_kind:
            raise PipelineError("INVALID_ARGUMENT", f"no {what} with id {array_id} in the P4Info")
        return [(p4info_kind[array_id], kinds[p4info_kind[array_id].name])]

    @staticmethod
    def _indexes(query, size) -> slice:
        """The cells a query asks for, as a slice of the array."""
        if query.HasField("index"):
            if query.index.index < 0:
                raise PipelineError("INVALID_ARGUMENT", f"index {query.index.index} is negative")
            if query.index.index >= size:
                raise PipelineError("OUT_OF_RANGE", f"index {query.index.index} >= {size}")
            return slice(query.index.index, query.index.index + 1)
        return slice(0, size)

    def _read_counter_entry(self, pipeline, query, out: ReadParts):
        info = pipeline.p4info.counters
        add = out.add
        for cinfo, arr in self._arrays(pipeline.counters, query.counter_id, "counter", info):
            cells = self._indexes(query, cinfo.size)
            out.reserve(cells.stop - cells.start)
            for i, (packets, nbytes) in enumerate(arr[cells].view(np.int64).tolist(),
                                                  cells.start):
                c = add().counter_entry
                c.counter_id = cinfo.id
                c.index.index = i
                c.data.packet_count = packets
                c.data.byte_count = nbytes

    def _read_register_entry(self, pipeline, query, out: ReadParts):
        info = pipeline.p4info.registers
        add = out.add
        for rinfo, arr in self._arrays(pipeline.registers, query.register_id, "register", info):
            cells = self._indexes(query, rinfo.size)
            out.reserve(cells.stop - cells.start)
            for i, value in enumerate(arr[cells].tolist(), cells.start):
                r = add().register_entry
                r.register_id = rinfo.id
                r.index.index = i
                r.data.bitstring = encode(value, rinfo.bitwidth)


def serve(device: Device, address: str) -> tuple[grpc.Server, int]:
    """Start the P4Runtime server on ``address`` (host:port); returns it and its port.

    The port is never shared (no SO_REUSEPORT): a switch whose address is taken
    fails here instead of splitting clients with another process.
    """
    common = logging.getLogger("grpc._common")  # a client's junk must not flood the log
    if not any(isinstance(f, Sparing) for f in common.filters):
        common.addFilter(Sparing())
    problem = _unbindable(address)
    if problem:  # said here in one line, before gRPC's core logs its own
        raise OSError(f"cannot listen for P4Runtime on {address}: {problem}")
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=MAX_STREAMS + UNARY_THREADS,
                                                    thread_name_prefix="p4rt"),
                         options=[("grpc.so_reuseport", 0)])
    p4runtime_pb2_grpc.add_P4RuntimeServicer_to_server(P4RuntimeServicer(device), server)
    try:
        bound = server.add_insecure_port(address)
    except RuntimeError:
        bound = 0
    if bound == 0:
        raise OSError(f"cannot listen for P4Runtime on {address}: the address is taken "
                      "or not local (another switch may still run there)")
    server.start()
    return server, bound


def _unbindable(address: str) -> str | None:
    """Why a listening socket cannot be bound to ``address`` (host:port), or None."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    try:
        family, kind, proto, _, where = socket.getaddrinfo(
            host or None, int(port), type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    except (socket.gaierror, ValueError, UnicodeError) as exc:
        return f"the host does not resolve ({exc})"
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC binds
        try:
            probe.bind(where)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return "the address is taken (another switch may still run there)"
            if exc.errno == errno.EADDRNOTAVAIL:
                return "not an address of this machine"
            return exc.strerror or str(exc)
    return None


def _cells(entry, info, kind: str) -> slice:
    """The cells of a register or counter array an entry addresses: its index, or all."""
    if not entry.HasField("index"):
        return slice(0, info.size)
    i = entry.index.index
    if i < 0:
        raise PipelineError("INVALID_ARGUMENT", f"{kind} index {i} is negative")
    if i >= info.size:
        raise PipelineError("OUT_OF_RANGE", f"{info.name}: index {i} >= {info.size}")
    return slice(i, i + 1)
