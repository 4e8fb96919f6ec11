"""StreamChannels of the embedded switch's P4Runtime server: arbitration by the spec's
rules, and what each stream may hold.

A stream's first message must be a MasterArbitrationUpdate, within
``ARBITRATION_WAIT`` seconds, or the stream is closed (FAILED_PRECONDITION): clients
that open streams and say nothing cannot keep every one of the ``MAX_STREAMS`` slots.
At most ``OUTBOX`` messages wait for a client that does not read its stream; one more
closes it (RESOURCE_EXHAUSTED) and its requests are no longer read, so such a client
cannot grow the switch's memory.
"""

from __future__ import annotations

import collections
import logging
import threading
import time

import grpc

from ..proto import code_pb2, p4runtime_pb2

log = logging.getLogger("qaina.switch.p4runtime")

#: StreamChannels served at once; each holds a server thread while it is open
MAX_STREAMS = 8
#: seconds a new stream has to send its MasterArbitrationUpdate
ARBITRATION_WAIT = 10.0
#: messages that may wait for a client to read them, per stream
OUTBOX = 256
#: seconds after an outbox overflowed that its RPC is cancelled if it has not ended
CANCEL_AFTER = 1.0


class StreamClosed(Exception):
    """Ends a StreamChannel with a gRPC status (``code`` a StatusCode name)."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


def election_of(eid) -> tuple[int, int]:
    """An election id as a comparable pair (high, low)."""
    return (eid.high, eid.low)


class Outbox:
    """The messages waiting to go out on one stream, at most ``limit`` of them. It ends
    with None (the client closed its side) or a ``StreamClosed``; ``cancel`` is called
    soon after it overflows, to end an RPC whose client does not read."""

    def __init__(self, cancel, limit: int = OUTBOX):
        self._items: collections.deque = collections.deque()
        self._ready = threading.Condition()
        self._limit = limit
        self._cancel = cancel
        self.ended = False

    def put(self, msg) -> bool:
        """Queue ``msg``; False if the outbox has ended or was full (which ends it)."""
        with self._ready:
            if self.ended:
                return False
            if len(self._items) < self._limit:
                self._items.append(msg)
                self._ready.notify()
                return True
            self._items.clear()  # nobody reads them
            self._end(StreamClosed("RESOURCE_EXHAUSTED", f"more than {self._limit} messages "
                                   "wait for this client: it does not read its stream"))
        log.warning("a stream channel closed: its client does not read it")
        # The RPC ends with that status when its thread takes it; a thread stuck
        # sending to a client that reads nothing is freed by cancelling the RPC.
        timer = threading.Timer(CANCEL_AFTER, self._cancel)
        timer.daemon = True
        timer.start()
        return False

    def end(self, last=None):
        """No more messages: ``last`` (None or a ``StreamClosed``) goes after those queued."""
        with self._ready:
            self._end(last)

    def _end(self, last):
        if not self.ended:
            self.ended = True
            self._items.append(last)
            self._ready.notify()

    def get(self, timeout: float | None):
        """The next message, or ``self`` if none came within ``timeout`` seconds."""
        with self._ready:
            if not self._items and not self._ready.wait_for(lambda: self._items, timeout):
                return self
            return self._items.popleft()


class StreamChannels:
    """The StreamChannel RPC of ``P4RuntimeServicer``; its state is ``self.device``'s
    (``lock``, ``streams``, ``open_streams``, ``primary``, ``highest``)."""

    def StreamChannel(self, request_iterator, context):
        dev = self.device
        with dev.lock:
            if dev.open_streams >= MAX_STREAMS:
                context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                              f"this switch serves at most {MAX_STREAMS} stream channels")
            dev.open_streams += 1
        out = Outbox(context.cancel)
        key = id(out)
        try:
            threading.Thread(target=self._read_stream, args=(request_iterator, key, out),
                             daemon=True, name="p4rt-stream").start()
            deadline = time.monotonic() + ARBITRATION_WAIT
            while True:
                with dev.lock:
                    arbitrated = key in dev.streams
                wait = None if arbitrated else deadline - time.monotonic()
                if wait is not None and wait <= 0:
                    context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                  f"no MasterArbitrationUpdate within {ARBITRATION_WAIT:g} s "
                                  "of opening the stream: send it first")
                msg = out.get(wait)
                if msg is out:
                    continue
                if msg is None:
                    return
                if isinstance(msg, StreamClosed):
                    context.abort(getattr(grpc.StatusCode, msg.code), str(msg))
                yield msg
        finally:
            with dev.lock:
                dev.open_streams -= 1

    def _read_stream(self, request_iterator, key, out: Outbox):
        """Answer a stream's requests until the client closes it, or its outbox ends."""
        last = None
        try:
            for msg in request_iterator:
                kind = msg.WhichOneof("update")
                if kind == "arbitration":
                    self._arbitrate(key, msg.arbitration, out)
                elif kind == "packet":
                    reply = self._stream_error(code_pb2.UNIMPLEMENTED,
                                               "this switch has no CPU port")
                else:
                    reply = self._stream_error(code_pb2.UNIMPLEMENTED,
                                               f"stream message {kind} not supported")
                if kind != "arbitration" and not out.put(reply):
                    break
                if out.ended:
                    break
        except StreamClosed as exc:
            last = exc
        except grpc.RpcError:
            pass
        finally:
            self._disconnect(key)
            out.end(last)

    @staticmethod
    def _stream_error(code, message):
        resp = p4runtime_pb2.StreamMessageResponse()
        resp.error.canonical_code = code
        resp.error.message = message
        return resp

    def _arbitrate(self, key, arbitration, out: Outbox):
        """The spec's rules for a MasterArbitrationUpdate (section "Rules for Handling
        MasterArbitrationUpdate Messages Received from Controllers")."""
        dev = self.device
        with dev.lock:
            known = dev.streams.get(key)
            if arbitration.device_id != dev.device_id:
                if known is None:
                    raise StreamClosed("NOT_FOUND", f"no device {arbitration.device_id} here "
                                       f"(this switch is device {dev.device_id})")
                raise StreamClosed("FAILED_PRECONDITION", "a stream cannot change its device")
            if arbitration.HasField("role") and arbitration.role.name:
                raise StreamClosed("INVALID_ARGUMENT", "this switch knows only the default role")
            election = (election_of(arbitration.election_id)
                        if arbitration.HasField("election_id") else None)
            if election is not None and any(e == election for k, (e, _) in dev.streams.items()
                                            if k != key):
                raise StreamClosed("INVALID_ARGUMENT", f"election id {election} is already "
                                   "used by another live controller of this device")
            dev.streams[key] = (election, out)
            was_primary = dev.primary is not None and known is not None and known[0] == dev.primary
            if election is not None and (dev.highest is None or election >= dev.highest):
                dev.highest = election
                dev.primary = election
                self._announce()
            elif was_primary:  # the primary downgraded itself
                dev.primary = None
                self._announce()
            else:
                self._notify(election, out)

    def _disconnect(self, key):
        dev = self.device
        with dev.lock:
            gone = dev.streams.pop(key, None)
            if gone is not None and gone[0] is not None and gone[0] == dev.primary:
                dev.primary = None
                self._announce()

    def _announce(self):
        """Tell every client who is primary."""
        for election, out in list(self.device.streams.values()):
            self._notify(election, out)

    def _notify(self, election, out: Outbox):
        """The arbitration advisory for one client (spec: "Client Arbitration
        Notifications")."""
        dev = self.device
        resp = p4runtime_pb2.StreamMessageResponse()
        arb = resp.arbitration
        arb.device_id = dev.device_id
        if dev.highest is not None:
            arb.election_id.high, arb.election_id.low = dev.highest
        if dev.primary is not None and election == dev.primary:
            arb.status.code, arb.status.message = code_pb2.OK, "primary"
        elif dev.primary is not None:
            arb.status.code, arb.status.message = code_pb2.ALREADY_EXISTS, "backup"
        else:
            arb.status.code, arb.status.message = code_pb2.NOT_FOUND, "backup; no primary"
        out.put(resp)
