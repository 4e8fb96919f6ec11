"""The P4Runtime control plane: one ``SwitchConnection`` per switch, either target.

Names come from the P4Info of ``qaina.p4`` (``qaina_bench.p4.p4info``); values are
ints and are encoded to canonical bytestrings here.
"""

from __future__ import annotations

import queue
import threading
import time

import grpc

from ...p4.p4info import P4Info, decode, encode
from ...p4.proto import code_pb2, p4runtime_pb2, p4runtime_pb2_grpc, status_pb2, text_format

_ACTION = p4runtime_pb2.SetForwardingPipelineConfigRequest

#: the harness's election id: high, so that other clients of a switch (p4runtime-shell
#: attached by ``qaina-bench shell``, tests) can come below it as backups
PRIMARY_ELECTION_ID = (1, 0)


class ControlError(RuntimeError):
    """A switch refused or did not answer a control-plane request."""


def update_errors(exc: grpc.RpcError) -> list[p4runtime_pb2.Error]:
    """The per-update ``p4.v1.Error`` list of a failed Write (empty if it has none)."""
    for key, value in (exc.trailing_metadata() or ()):
        if key == "grpc-status-details-bin":
            status = status_pb2.Status.FromString(value)
            errors = []
            for detail in status.details:
                error = p4runtime_pb2.Error()
                if detail.Unpack(error):
                    errors.append(error)
            return errors
    return []


def _describe(exc: grpc.RpcError) -> str:
    failed = [(i, e) for i, e in enumerate(update_errors(exc), 1)
              if e.canonical_code != code_pb2.OK]
    if failed:
        return "; ".join(f"update {i}: {code_pb2.Code.Name(e.canonical_code)}: {e.message}"
                         for i, e in failed)
    return f"{exc.code().name}: {exc.details()}"


class RequestLog(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):
    """Every P4Runtime request and response of a connection, written to a file as
    protobuf text (what a switch refused can be read afterwards, as with p4lang's
    tutorials' request logger). Reads take one line per request and per response. The
    sampler repeats one Read many times a second: a Read the same as the one before
    is counted, not written (with its responses), and the count is written when
    another request comes or the log closes; a Read that fails is always written."""

    def __init__(self, path):
        self.file = open(path, "a", buffering=1)
        self.lock = threading.Lock()
        self._last_read: bytes | None = None  # the last Read written, serialized
        self._repeats = 0  # Reads the same as it since, not written

    def write(self, arrow: str, method: str, message=None, error: str | None = None):
        name = method.rsplit("/", 1)[-1]
        if name == "SetForwardingPipelineConfig" and message is not None and \
                message.DESCRIPTOR.name.endswith("Request") and message.config.p4_device_config:
            shown = type(message)()
            shown.CopyFrom(message)  # the compiled program is too big to read: its size
            shown.config.p4_device_config = (
                f"<{len(message.config.p4_device_config)} bytes>".encode())
            message = shown
        if error is not None:
            text = error
        elif name == "Read":
            text = text_format.MessageToString(message, as_one_line=True)
        else:
            text = "\n" + text_format.MessageToString(message).rstrip()
        with self.lock:
            self._write_repeats()
            self.file.write(f"{_stamp()} {arrow} {name} {text}\n")

    def _repeated(self, method: str, request) -> bool:
        """Whether ``request`` is a Read the same as the last one written (counted)."""
        if not method.endswith("/Read"):
            return False
        key = request.SerializeToString(deterministic=True)
        with self.lock:
            if key == self._last_read:
                self._repeats += 1
                return True
            self._write_repeats()
            self._last_read = key
            return False

    def _write_repeats(self):
        if self._repeats:
            self.file.write(f"{_stamp()} = Read: {self._repeats} more the same as the last "
                            "Read written, not written\n")
            self._repeats = 0

    def intercept_unary_unary(self, continuation, details, request):
        self.write(">", details.method, request)
        outcome = continuation(details, request)
        try:
            self.write("<", details.method, outcome.result())
        except grpc.RpcError as exc:
            self.write("<", details.method, error=f"ERROR {_describe(exc)}")
        return outcome

    def intercept_unary_stream(self, continuation, details, request):
        repeat = self._repeated(details.method, request)
        if not repeat:
            self.write(">", details.method, request)
        responses = continuation(details, request)

        def logged():
            try:
                for response in responses:
                    if not repeat:
                        self.write("<", details.method, response)
                    yield response
            except grpc.RpcError as exc:
                if repeat:
                    self.write(">", details.method, request)
                self.write("<", details.method, error=f"ERROR {_describe(exc)}")
                raise
        return logged()

    def close(self):
        with self.lock:
            self._write_repeats()
        self.file.close()


def _stamp() -> str:
    return time.strftime("%H:%M:%S") + f".{int(time.time() * 1000) % 1000:03d}"


#: a failed Write's status carries one p4.v1.Error per update in its trailing metadata,
#: about 35 bytes each: gRPC's default 16 kB limit would cut any batch of more than
#: about 400 updates to "Stream removed"
CHANNEL_OPTIONS = [("grpc.max_metadata_size", 64 << 20)]


class _ElectionIdHeld(Exception):
    """The server refused a stream's arbitration as INVALID_ARGUMENT (its election id
    held by another live stream)."""


class SwitchConnection:
    """A primary P4Runtime client of one switch; with ``log_path``, every request and
    response goes to that file (``RequestLog``)."""

    def __init__(self, name: str, address: str, device_id: int, p4info: P4Info | None = None,
                 election_id: tuple[int, int] = PRIMARY_ELECTION_ID, log_path=None):
        self.name = name
        self.address = address
        self.device_id = device_id
        self.p4info = p4info or P4Info.load()
        self.election_id = election_id
        self.channel = grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
        # the readiness probe goes round the request log: it is not a request of the run
        self._probe = p4runtime_pb2_grpc.P4RuntimeStub(self.channel)
        self.log = RequestLog(log_path) if log_path else None
        if self.log is not None:
            self.channel = grpc.intercept_channel(self.channel, self.log)
        self.stub = p4runtime_pb2_grpc.P4RuntimeStub(self.channel)
        self._requests: queue.Queue = queue.Queue()
        self._responses: queue.Queue = queue.Queue()
        self._stream = None

    # -- session -----------------------------------------------------------------------
    def wait_ready(self, timeout: float) -> bool:
        """True once the switch's gRPC server answers: a Capabilities call that waits
        for the connection. (gRPC's ready future polls the channel from a thread of its
        own, which a Ctrl-C during the wait left running into ``close``: a traceback.)"""
        try:
            self._probe.Capabilities(p4runtime_pb2.CapabilitiesRequest(), timeout=timeout,
                                     wait_for_ready=True)
            return True
        except grpc.RpcError as exc:  # any answer but none at all says the server is up
            return exc.code() not in (grpc.StatusCode.DEADLINE_EXCEEDED,
                                      grpc.StatusCode.UNAVAILABLE)

    def arbitrate(self, timeout: float = 5.0, held_for: float = 0.0):
        """Open the stream channel and become primary. ``held_for``: seconds to try again
        while the server refuses this election id as another live stream's (one of ours
        just closed that it has not yet seen go: the spec's INVALID_ARGUMENT)."""
        again_until = time.monotonic() + held_for
        while True:
            try:
                return self._arbitrate_once(timeout)
            except _ElectionIdHeld as exc:
                self._end_stream()
                if time.monotonic() >= again_until:
                    raise ControlError(f"{self.name}: stream channel failed: {exc}") from None
                time.sleep(0.05)

    def _arbitrate_once(self, timeout: float):
        self._requests, self._responses = queue.Queue(), queue.Queue()
        requests, responses = self._requests, self._responses

        def outgoing():
            while True:
                msg = requests.get()
                if msg is None:
                    return
                yield msg

        self._stream = stream = self.stub.StreamChannel(outgoing())
        threading.Thread(target=self._pump, args=(stream, responses), daemon=True,
                         name=f"p4rt-{self.name}").start()
        req = p4runtime_pb2.StreamMessageRequest()
        req.arbitration.device_id = self.device_id
        req.arbitration.election_id.high, req.arbitration.election_id.low = self.election_id
        if self.log is not None:
            self.log.write(">", "StreamChannel", req)
        requests.put(req)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                msg = responses.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                break
            if isinstance(msg, grpc.RpcError):
                if msg.code() == grpc.StatusCode.INVALID_ARGUMENT:
                    raise _ElectionIdHeld(_describe(msg))
                raise ControlError(f"{self.name}: stream channel failed: {_describe(msg)}")
            if msg.HasField("arbitration"):
                if self.log is not None:
                    self.log.write("<", "StreamChannel", msg)
                if msg.arbitration.status.code != code_pb2.OK:
                    raise ControlError(f"{self.name}: not primary: "
                                       f"{msg.arbitration.status.message}")
                return
            if msg.HasField("error"):
                raise ControlError(f"{self.name}: {msg.error.message}")
        raise ControlError(f"{self.name}: no arbitration answer within {timeout:.0f} s")

    @staticmethod
    def _pump(stream, responses: queue.Queue):
        try:
            for msg in stream:
                responses.put(msg)
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.CANCELLED:
                responses.put(exc)

    def _end_stream(self):
        self._requests.put(None)
        if self._stream is not None:
            self._stream.cancel()
            self._stream = None

    def close(self):
        self._end_stream()
        self.channel.close()
        if self.log is not None:
            self.log.close()

    def _call(self, what: str, fn, request):
        try:
            return fn(request, timeout=10)
        except grpc.RpcError as exc:
            raise ControlError(f"{self.name}: {what}: {_describe(exc)}") from None

    # -- pipeline ----------------------------------------------------------------------
    def set_pipeline(self, device_config: bytes = b"", cookie: int = 1):
        req = p4runtime_pb2.SetForwardingPipelineConfigRequest()
        req.device_id = self.device_id
        req.election_id.high, req.election_id.low = self.election_id
        req.action = _ACTION.VERIFY_AND_COMMIT
        req.config.p4info.CopyFrom(self.p4info.proto)
        req.config.p4_device_config = device_config
        req.config.cookie.cookie = cookie
        self._call("SetForwardingPipelineConfig", self.stub.SetForwardingPipelineConfig, req)

    # -- writes ------------------------------------------------------------------------
    def _write(self, what: str, updates):
        req = p4runtime_pb2.WriteRequest()
        req.device_id = self.device_id
        req.election_id.high, req.election_id.low = self.election_id
        req.updates.extend(updates)
        self._call(what, self.stub.Write, req)

    def table_entry(self, table: str, match: dict, action: str, params: dict | None = None,
                    default: bool = False) -> p4runtime_pb2.TableEntry:
        """A TableEntry; ``match`` maps field names to ints or (value, prefix_len)."""
        t = self.p4info.table(table)
        a = self.p4info.action(action)
        e = p4runtime_pb2.TableEntry(table_id=t.id, is_default_action=default)
        for fname, value in match.items():
            mf = t.match_field(fname)
            m = e.match.add(field_id=mf.id)
            if mf.match_type == "LPM":
                v, plen = value
                if plen == 0:
                    e.match.pop()  # a /0 prefix is expressed by omitting the field
                    continue
                m.lpm.value = encode(v, mf.bitwidth)
                m.lpm.prefix_len = plen
            else:
                m.exact.value = encode(value, mf.bitwidth)
        e.action.action.action_id = a.id
        params = dict(params or {})
        for p in a.params:
            if p.name not in params:
                raise ControlError(f"{a.name} needs parameter {p.name}")
            e.action.action.params.add(param_id=p.id, value=encode(params.pop(p.name), p.bitwidth))
        if params:
            raise ControlError(f"{a.name} has no parameters {sorted(params)}")
        return e

    def insert(self, table: str, match: dict, action: str, params: dict | None = None):
        entry = self.table_entry(table, match, action, params)
        update = p4runtime_pb2.Update(type=p4runtime_pb2.Update.INSERT)
        update.entity.table_entry.CopyFrom(entry)
        self._write(f"insert into {table}", [update])

    def insert_many(self, entries):
        """Insert ``(table, match, action, params)`` tuples in one Write."""
        self._write_many(p4runtime_pb2.Update.INSERT, "insert", entries)

    def delete_many(self, entries):
        """Delete the entries of ``(table, match, action, params)`` tuples in one Write."""
        self._write_many(p4runtime_pb2.Update.DELETE, "delete", entries)

    def modify_many(self, entries):
        """Change the actions of existing entries to those of ``(table, match, action,
        params)`` tuples, in one Write."""
        self._write_many(p4runtime_pb2.Update.MODIFY, "modify", entries)

    def _write_many(self, kind, verb: str, entries):
        updates = []
        for table, match, action, params in entries:
            u = p4runtime_pb2.Update(type=kind)
            u.entity.table_entry.CopyFrom(self.table_entry(table, match, action, params))
            updates.append(u)
        if updates:
            self._write(f"{verb} {len(updates)} entries", updates)

    def set_default(self, table: str, action: str, params: dict | None = None):
        """The action ``table`` runs on a miss (a MODIFY of its default entry)."""
        update = p4runtime_pb2.Update(type=p4runtime_pb2.Update.MODIFY)
        update.entity.table_entry.CopyFrom(self.table_entry(table, {}, action, params,
                                                            default=True))
        self._write(f"default action of {table}", [update])

    def delete(self, table: str, match: dict, action: str, params: dict | None = None):
        entry = self.table_entry(table, match, action, params)
        update = p4runtime_pb2.Update(type=p4runtime_pb2.Update.DELETE)
        update.entity.table_entry.CopyFrom(entry)
        self._write(f"delete from {table}", [update])

    def set_multicast_group(self, group: int, replicas, insert: bool = True):
        """``replicas``: (egress port, instance) pairs."""
        self._write_group(p4runtime_pb2.Update.INSERT if insert else p4runtime_pb2.Update.MODIFY,
                          group, replicas)

    def delete_multicast_group(self, group: int):
        self._write_group(p4runtime_pb2.Update.DELETE, group, ())

    def _write_group(self, kind, group: int, replicas):
        u = p4runtime_pb2.Update(type=kind)
        g = u.entity.packet_replication_engine_entry.multicast_group_entry
        g.multicast_group_id = group
        for port, instance in replicas:
            g.replicas.add(egress_port=port, instance=instance)
        self._write(f"multicast group {group}", [u])

    def write_registers(self, name: str, cells: dict[int, int]):
        """Set register cells ``{index: value}`` in one Write (the embedded switch
        serves these; BMv2 answers UNIMPLEMENTED, ``BMv2Target.registers`` writes them
        through Thrift)."""
        r = self.p4info.register(name)
        updates = []
        for index, value in sorted(cells.items()):
            u = p4runtime_pb2.Update(type=p4runtime_pb2.Update.MODIFY)
            u.entity.register_entry.register_id = r.id
            u.entity.register_entry.index.index = index
            u.entity.register_entry.data.bitstring = encode(value, r.bitwidth)
            updates.append(u)
        if updates:
            self._write(f"write {len(updates)} cells of register {name}", updates)

    # -- reads -------------------------------------------------------------------------
    def _read(self, what: str, entity, timeout: float = 10.0) -> list:
        req = p4runtime_pb2.ReadRequest(device_id=self.device_id)
        req.entities.add().CopyFrom(entity)
        try:
            return [e for resp in self.stub.Read(req, timeout=timeout) for e in resp.entities]
        except grpc.RpcError as exc:
            raise ControlError(f"{self.name}: read {what}: {_describe(exc)}") from None

    def read_counter(self, name: str) -> dict[int, tuple[int, int]]:
        """``{index: (packets, bytes)}`` of one counter array."""
        c = self.p4info.counter(name)
        entity = p4runtime_pb2.Entity()
        entity.counter_entry.counter_id = c.id
        return {e.counter_entry.index.index: (e.counter_entry.data.packet_count,
                                              e.counter_entry.data.byte_count)
                for e in self._read(f"counter {name}", entity)}

    def read_counter_cells(self, names, indexes) -> dict[str, dict[int, tuple[int, int]]]:
        """Cells ``indexes`` of the counters ``names``, in one Read:
        ``{name: {index: (packets, bytes)}}``."""
        req = p4runtime_pb2.ReadRequest(device_id=self.device_id)
        by_id = {}
        for name in names:
            c = self.p4info.counter(name)
            by_id[c.id] = c.name
            for index in indexes:
                e = req.entities.add().counter_entry
                e.counter_id = c.id
                e.index.index = index
        out: dict[str, dict] = {n: {} for n in by_id.values()}
        try:
            for resp in self.stub.Read(req, timeout=10):
                for e in resp.entities:
                    c = e.counter_entry
                    out[by_id[c.counter_id]][c.index.index] = (c.data.packet_count,
                                                               c.data.byte_count)
        except grpc.RpcError as exc:
            raise ControlError(f"{self.name}: read counters: {_describe(exc)}") from None
        return out

    def read_counters(self) -> dict[str, dict[int, tuple[int, int]]]:
        """All counters in one Read: ``{name: {index: (packets, bytes)}}``."""
        entity = p4runtime_pb2.Entity()
        entity.counter_entry.counter_id = 0
        out: dict[str, dict] = {c.name: {} for c in self.p4info.counters.values()}
        for e in self._read("counters", entity):
            c = e.counter_entry
            out[self.p4info.counter(c.counter_id).name][c.index.index] = (
                c.data.packet_count, c.data.byte_count)
        return out

    def read_register(self, name: str, index: int | None = None) -> dict[int, int]:
        """Register cells (the embedded switch serves these; BMv2 answers UNIMPLEMENTED)."""
        r = self.p4info.register(name)
        entity = p4runtime_pb2.Entity()
        entity.register_entry.register_id = r.id
        if index is not None:
            entity.register_entry.index.index = index
        return {e.register_entry.index.index: decode(e.register_entry.data.bitstring)
                # a whole agg_sum of the 256-word build is 512 Ki cells: seconds
                for e in self._read(f"register {name}", entity, timeout=120.0)}

    def read_table(self, name: str) -> list:
        entity = p4runtime_pb2.Entity()
        entity.table_entry.table_id = self.p4info.table(name).id
        return [e.table_entry for e in self._read(f"table {name}", entity)]
