"""The switches' P4Runtime servers: arbitration and batches follow the P4Runtime spec,
requests they do not serve get a proper gRPC status, and a foreign program is refused
(p4runtime-shell against them: tests/test_shell.py).

Every case runs against the embedded switch, and against BMv2's own server where
BMv2 is installed; where BMv2's server behaves differently the test pins what it
does (p4/README.md, "P4Runtime servers", lists the differences).
"""

from __future__ import annotations

import subprocess
import threading
import time

import grpc
import pytest

from conftest import free_port, root
from qaina_bench.harness.switches.control import ControlError, SwitchConnection, update_errors
from qaina_bench.harness.switches.targets import make_target
from qaina_bench.p4.embedded.streams import ARBITRATION_WAIT, MAX_STREAMS
from qaina_bench.p4.proto import code_pb2, p4info_pb2, p4runtime_pb2, p4runtime_pb2_grpc

pytestmark = root


def test_errors_are_grpc_statuses(fresh):
    conn = fresh.conn
    conn.insert("MyIngress.aggregator_addr", {"hdr.ipv4.dstAddr": 1}, "MyIngress.accept_qaina")
    with pytest.raises(ControlError, match="ALREADY_EXISTS"):
        conn.insert("MyIngress.aggregator_addr", {"hdr.ipv4.dstAddr": 1},
                    "MyIngress.accept_qaina")
    with pytest.raises(ControlError, match="NOT_FOUND"):
        conn.delete("MyIngress.aggregator_addr", {"hdr.ipv4.dstAddr": 2},
                    "MyIngress.accept_qaina")
    with pytest.raises(ControlError, match="INVALID_ARGUMENT"):  # bits beyond the prefix
        conn.insert("MyIngress.ipv4_lpm", {"hdr.ipv4.dstAddr": (0x0A000001, 24)},
                    "MyIngress.forward", {"port": 1})

    def raw_write(update):
        req = p4runtime_pb2.WriteRequest(device_id=1)
        req.election_id.high, req.election_id.low = conn.election_id
        req.updates.append(update)
        return conn._call("write", conn.stub.Write, req)

    u = p4runtime_pb2.Update(type=p4runtime_pb2.Update.INSERT)
    u.entity.table_entry.table_id = 0x02FFFFFF  # an id the P4Info does not have
    with pytest.raises(ControlError, match="INVALID_ARGUMENT"):
        raw_write(u)
    u = p4runtime_pb2.Update(type=p4runtime_pb2.Update.INSERT)
    e = u.entity.table_entry
    e.CopyFrom(conn.table_entry("MyIngress.ipv4_lpm", {"hdr.ipv4.dstAddr": (0x0A000000, 8)},
                                "MyIngress.forward", {"port": 1}))
    e.action.action.params[0].value = b"\x02\x00"  # 512 does not fit bit<9>
    with pytest.raises(ControlError, match="INVALID_ARGUMENT"):
        raw_write(u)


def test_a_batch_attempts_every_update_and_reports_each(fresh):
    """CONTINUE_ON_ERROR: [valid, invalid, valid] applies both valid updates; the
    status is UNKNOWN with one p4.v1.Error per update, in order."""
    conn = fresh.conn
    updates = []
    for address in (11, 12, 13):
        u = p4runtime_pb2.Update(type=p4runtime_pb2.Update.INSERT)
        u.entity.table_entry.CopyFrom(conn.table_entry(
            "MyIngress.aggregator_addr", {"hdr.ipv4.dstAddr": address}, "MyIngress.accept_qaina"))
        updates.append(u)
    updates[1].entity.table_entry.table_id = 0x02FFFFFF  # no such table
    req = p4runtime_pb2.WriteRequest(device_id=1, updates=updates)
    req.election_id.high, req.election_id.low = conn.election_id
    with pytest.raises(grpc.RpcError) as err:
        conn.stub.Write(req, timeout=10)
    assert err.value.code() == grpc.StatusCode.UNKNOWN
    codes = [e.canonical_code for e in update_errors(err.value)]
    assert len(codes) == 3 and codes[0] == codes[2] == code_pb2.OK
    assert codes[1] == code_pb2.INVALID_ARGUMENT
    held = {e.match[0].exact.value for e in conn.read_table("MyIngress.aggregator_addr")}
    assert held == {b"\x0b", b"\x0d"}
    with pytest.raises(ControlError, match="update 2: INVALID_ARGUMENT"):
        conn._call("write", conn.stub.Write, req)


def test_primary_is_served_while_other_streams_are_open(fresh):
    """Three more clients hold stream channels; the primary's Read and Write still
    answer at once."""
    backups = [SwitchConnection(f"backup{i}", fresh.target.grpc_addr, 1, election_id=(0, i))
               for i in (1, 2, 3)]
    try:
        for b in backups:
            with pytest.raises(ControlError, match="not primary"):
                b.arbitrate()
        started = time.monotonic()
        fresh.conn.insert("MyIngress.aggregator_addr", {"hdr.ipv4.dstAddr": 21},
                          "MyIngress.accept_qaina")
        assert len(fresh.conn.read_table("MyIngress.aggregator_addr")) == 1
        assert fresh.conn.read_counter("MyIngress.drops")
        assert time.monotonic() - started < 5
        with pytest.raises(ControlError, match="PERMISSION_DENIED"):
            backups[0].insert("MyIngress.aggregator_addr", {"hdr.ipv4.dstAddr": 22},
                              "MyIngress.accept_qaina")
    finally:
        for b in backups:
            b.close()


#: stream channels a server takes at once: ours, and BMv2's (measured: 16)
STREAM_LIMIT = {"embedded": MAX_STREAMS, "bmv2": 16}


def test_stream_channels_beyond_the_limit_are_refused(fresh):
    limit = STREAM_LIMIT[fresh.kind]
    extra = [SwitchConnection(f"extra{i}", fresh.target.grpc_addr, 1, election_id=(0, i))
             for i in range(1, limit + 1)]
    try:
        for i, c in enumerate(extra, 2):  # the lab's primary holds one stream
            if i <= limit:
                with pytest.raises(ControlError, match="not primary"):
                    c.arbitrate()
            else:
                with pytest.raises(ControlError, match="RESOURCE_EXHAUSTED"):
                    c.arbitrate()
        fresh.conn.read_counter("MyIngress.drops")  # the primary is still served
    finally:
        for c in extra:
            c.close()


def test_an_election_id_in_use_is_refused(fresh):
    twin = SwitchConnection("twin", fresh.target.grpc_addr, 1, election_id=fresh.conn.election_id)
    try:
        with pytest.raises(ControlError, match="INVALID_ARGUMENT"):
            twin.arbitrate()
    finally:
        twin.close()
    fresh.conn.insert("MyIngress.aggregator_addr", {"hdr.ipv4.dstAddr": 31},
                      "MyIngress.accept_qaina")  # still the primary


def test_an_election_id_is_taken_over_once_its_stream_has_gone(fresh):
    """A controller coming back with its closed connection's election id: refused while
    the server still holds the old stream, primary once it has let it go."""
    twin = SwitchConnection("twin", fresh.target.grpc_addr, 1, election_id=fresh.conn.election_id)
    try:
        started = time.monotonic()
        with pytest.raises(ControlError, match="INVALID_ARGUMENT"):
            twin.arbitrate(held_for=0.3)
        assert time.monotonic() - started >= 0.3  # it tried again meanwhile
        threading.Timer(0.3, fresh.conn.close).start()
        twin.arbitrate(held_for=10)
        twin.insert("MyIngress.aggregator_addr", {"hdr.ipv4.dstAddr": 32},
                    "MyIngress.accept_qaina")  # the primary now
    finally:
        twin.close()
        fresh.reconnect()


def test_only_the_primary_writes_and_foreign_programs_are_refused(fresh):
    backup = SwitchConnection("backup", fresh.target.grpc_addr, 1, election_id=(0, 7))
    try:
        with pytest.raises(ControlError, match="not primary"):
            backup.arbitrate()
        with pytest.raises(ControlError, match="PERMISSION_DENIED"):
            backup.insert("MyIngress.aggregator_addr", {"hdr.ipv4.dstAddr": 3},
                          "MyIngress.accept_qaina")
    finally:
        backup.close()
    for change in ("empty", "drops has 4 cells"):
        foreign = p4info_pb2.P4Info()
        if change != "empty":
            foreign.CopyFrom(fresh.conn.p4info.proto)
            next(c for c in foreign.counters if c.preamble.name.endswith("drops")).size = 4
        Req = p4runtime_pb2.SetForwardingPipelineConfigRequest
        req = Req(device_id=1, action=Req.VERIFY_AND_COMMIT)
        req.election_id.high, req.election_id.low = fresh.conn.election_id
        req.config.p4info.CopyFrom(foreign)
        req.config.p4_device_config = fresh.target.device_config()
        call = fresh.conn.stub.SetForwardingPipelineConfig
        if fresh.kind == "bmv2":
            # BMv2 takes any P4Info with its JSON (p4/README.md, "P4Runtime servers");
            # the harness only sends p4c's P4Info of the same compile.
            fresh.conn._call("SetForwardingPipelineConfig", call, req)
        else:
            with pytest.raises(ControlError, match="INVALID_ARGUMENT: this embedded switch "
                                                   "runs the builds of qaina.p4 only"):
                fresh.conn._call("SetForwardingPipelineConfig", call, req)
    if fresh.kind == "embedded":
        assert len(fresh.conn.read_counter("MyIngress.drops")) == 16  # qaina.p4 still runs
    wrong_device = SwitchConnection("s1", fresh.target.grpc_addr, 9)
    # The spec says NOT_FOUND for an unknown device; BMv2 takes it for a device
    # without a program (p4/README.md, "P4Runtime servers").
    code = "FAILED_PRECONDITION" if fresh.kind == "bmv2" else "NOT_FOUND"
    with pytest.raises(ControlError, match=code):
        wrong_device.read_counter("MyIngress.drops")
    wrong_device.close()


def test_the_request_log_keeps_what_a_switch_refused(fresh, tmp_path):
    log = tmp_path / "p4runtime.log"
    fresh.conn.close()
    fresh.conn = SwitchConnection("s1", fresh.target.grpc_addr, 1, election_id=(1, 0),
                                  log_path=log)
    fresh.conn.arbitrate(held_for=5)
    fresh.conn.insert("MyIngress.aggregator_addr", {"hdr.ipv4.dstAddr": 41},
                      "MyIngress.accept_qaina")
    with pytest.raises(ControlError, match="ALREADY_EXISTS"):
        fresh.conn.insert("MyIngress.aggregator_addr", {"hdr.ipv4.dstAddr": 41},
                          "MyIngress.accept_qaina")
    for _ in range(5):  # a sampler's reads: the first is written, the rest counted
        fresh.conn.read_counter("MyIngress.drops")
    fresh.conn.read_counter("MyIngress.agg_packets")
    fresh.conn.read_counter("MyIngress.agg_packets")
    fresh.conn.close()  # writes the last count
    fresh.reconnect()  # the module's later tests use the lab's connection
    text = log.read_text()
    assert "> StreamChannel" in text and "< StreamChannel" in text
    assert text.count("> Write") == 2 and text.count("< Write") == 2
    assert "ALREADY_EXISTS" in text.split("< Write", 2)[2]
    assert "> Read device_id: 1 entities { counter_entry" in text and "< Read entities" in text
    reads = [line.split(" ", 1)[1] for line in text.splitlines() if " Read" in line]
    assert [r[:6] for r in reads] == ["> Read", "< Read", "= Read", "> Read", "< Read",
                                      "= Read"], reads
    assert reads[2].startswith("= Read: 4 more the same") and reads[5].startswith("= Read: 1 ")


def test_pipeline_config_reads_back(fresh):
    req = p4runtime_pb2.GetForwardingPipelineConfigRequest(device_id=1)
    cfg = fresh.conn.stub.GetForwardingPipelineConfig(req).config
    assert {t.preamble.name for t in cfg.p4info.tables} == {
        t.name for t in fresh.conn.p4info.tables.values()}


def test_registers_read_back_where_the_server_serves_them(fresh):
    if fresh.kind == "bmv2":
        with pytest.raises(ControlError, match="UNIMPLEMENTED"):
            fresh.conn.read_register("MyIngress.agg_count")
        assert fresh.target.register_read("MyIngress.agg_count") == [0] * 2048
        return
    regs = fresh.conn.read_register("MyIngress.agg_count")
    assert len(regs) == 2048 and not any(regs.values())
    assert fresh.conn.read_register("MyIngress.agg_sum", index=65535) == {65535: 0}


def test_a_second_switch_on_a_taken_port_fails_at_start(fresh, tmp_path):
    """The P4Runtime port is never shared: a second switch told to use it exits with
    an error instead of splitting the clients (a dead run's switch, say)."""
    extra = {"thrift_port": free_port()} if fresh.kind == "bmv2" else {}
    second = make_target(fresh.kind, "s2", {}, fresh.target.grpc_port, 2,
                         tmp_path / "s2.log", **extra)
    second.start()
    try:
        code = second.proc.wait(3 if fresh.kind == "bmv2" else 15)
    except subprocess.TimeoutExpired:
        code = None
    finally:
        second.stop()
    log = (tmp_path / "s2.log").read_text()
    if fresh.kind == "bmv2":
        # simple_switch_grpc binds with gRPC's default SO_REUSEPORT: a second one starts
        # and shares the port (p4/README.md). The harness gives every switch a port of
        # its own, fresh from the kernel, so it never meets this.
        assert code is None, log
    else:
        assert code not in (None, 0), log
        assert "cannot listen for P4Runtime" in log and str(fresh.target.grpc_port) in log
    fresh.conn.read_counter("MyIngress.drops")  # the first switch is untouched


def test_a_read_by_key_gives_that_entry_alone(fresh):
    """Match fields in a Read filter it to the entry of that key (as p4runtime-shell's
    ``te.read()`` of an entry sends it); an empty entity is refused."""
    conn = fresh.conn
    routes = [(0x0A000000, 8), (0x0B000000, 8), (0x0C000000, 16)]
    for addr in routes:
        conn.insert("MyIngress.ipv4_lpm", {"hdr.ipv4.dstAddr": addr}, "MyIngress.forward",
                    {"port": 1})
    assert len(conn.read_table("MyIngress.ipv4_lpm")) == 3
    for addr, found in ((routes[1], 1), ((0x0D000000, 8), 0)):
        entity = p4runtime_pb2.Entity()
        entity.table_entry.CopyFrom(conn.table_entry(
            "MyIngress.ipv4_lpm", {"hdr.ipv4.dstAddr": addr}, "MyIngress.forward",
            {"port": 1}))
        entity.table_entry.ClearField("action")
        got = conn._read("route", entity)
        assert len(got) == found, got
        if found:
            assert got[0].table_entry.match[0].lpm.value == conn.table_entry(
                "MyIngress.ipv4_lpm", {"hdr.ipv4.dstAddr": addr}, "MyIngress.forward",
                {"port": 1}).match[0].lpm.value
    # BMv2 answers UNKNOWN ("Incorrect entity type"): p4/README.md, "P4Runtime servers"
    with pytest.raises(ControlError, match="UNKNOWN" if fresh.kind == "bmv2" else
                       "INVALID_ARGUMENT"):
        conn._read("nothing", p4runtime_pb2.Entity())


def test_a_pipeline_config_action_the_spec_lacks_is_refused_and_changes_nothing(fresh):
    conn = fresh.conn
    conn.insert("MyIngress.aggregator_addr", {"hdr.ipv4.dstAddr": 1}, "MyIngress.accept_qaina")
    req = p4runtime_pb2.SetForwardingPipelineConfigRequest(device_id=1, action=9)
    req.election_id.high, req.election_id.low = conn.election_id
    req.config.p4info.CopyFrom(fresh.p4info.proto)
    req.config.cookie.cookie = 77
    if fresh.kind == "bmv2":  # takes it (p4/README.md, "P4Runtime servers")
        conn._call("set pipeline", conn.stub.SetForwardingPipelineConfig, req)
        return
    with pytest.raises(ControlError, match="INVALID_ARGUMENT"):
        conn._call("set pipeline", conn.stub.SetForwardingPipelineConfig, req)
    assert len(conn.read_table("MyIngress.aggregator_addr")) == 1



def test_a_write_for_another_role_and_an_unknown_response_type_are_refused(fresh):
    """The primary's election id under a role no client arbitrated for writes
    nothing; a pipeline config asked for in a form the spec lacks is refused."""
    conn = fresh.conn
    for role in ({"role": "foo"}, {"role_id": 3}):
        req = p4runtime_pb2.WriteRequest(device_id=1, **role)
        req.election_id.high, req.election_id.low = conn.election_id
        u = req.updates.add(type=p4runtime_pb2.Update.INSERT)
        u.entity.table_entry.CopyFrom(conn.table_entry(
            "MyIngress.aggregator_addr", {"hdr.ipv4.dstAddr": 5}, "MyIngress.accept_qaina"))
        if fresh.kind == "bmv2":  # serves it as the default role's (p4/README.md)
            conn._call("write", conn.stub.Write, req)
            conn.delete("MyIngress.aggregator_addr", {"hdr.ipv4.dstAddr": 5},
                        "MyIngress.accept_qaina")
            continue
        with pytest.raises(ControlError, match="PERMISSION_DENIED"):
            conn._call("write", conn.stub.Write, req)
    assert conn.read_table("MyIngress.aggregator_addr") == []
    req = p4runtime_pb2.GetForwardingPipelineConfigRequest(device_id=1, response_type=99)
    with pytest.raises(ControlError, match="INVALID_ARGUMENT"):
        conn._call("get pipeline", conn.stub.GetForwardingPipelineConfig, req)


def test_a_read_of_a_negative_or_past_the_end_index_is_refused(fresh):
    conn = fresh.conn
    past = "UNKNOWN" if fresh.kind == "bmv2" else "OUT_OF_RANGE"  # (p4/README.md)
    for index, code in ((-1, "INVALID_ARGUMENT"), (16, past)):
        entity = p4runtime_pb2.Entity()
        entity.counter_entry.counter_id = conn.p4info.counter("MyIngress.drops").id
        entity.counter_entry.index.index = index
        with pytest.raises(ControlError, match=code):
            conn._read("a cell of drops", entity)


def _arbitration(election_low: int) -> p4runtime_pb2.StreamMessageRequest:
    m = p4runtime_pb2.StreamMessageRequest()
    m.arbitration.device_id = 1
    m.arbitration.election_id.low = election_low
    return m


def _stream_end(call) -> tuple[int, grpc.StatusCode | None]:
    """Read a stream to its end: the messages read and its status (None if OK)."""
    got = 0
    try:
        for _ in call:
            got += 1
    except grpc.RpcError as exc:
        return got, exc.code()
    return got, None


def test_streams_that_never_arbitrate_do_not_hold_the_slots(fresh):
    """Clients that open streams and send nothing. The embedded switch counts them
    against its stream limit until ``ARBITRATION_WAIT`` has passed, then closes them
    (FAILED_PRECONDITION) and a new controller is served. BMv2 counts only arbitrated
    streams: it serves a newcomer at once (pinned; p4/README.md, "P4Runtime servers")."""
    stub = fresh.conn.stub
    quiet = threading.Event()

    def silence():
        quiet.wait()
        return
        yield

    silent = [stub.StreamChannel(silence()) for _ in range(STREAM_LIMIT[fresh.kind] - 1)]
    try:
        time.sleep(1)  # the silent streams are open
        if fresh.kind == "embedded":
            deadline = time.monotonic() + 30
            while True:  # until the silent streams hold every slot: a newcomer is refused
                probe = SwitchConnection("probe", fresh.target.grpc_addr, 1,
                                         election_id=(0, 9))
                try:
                    probe.arbitrate()
                except ControlError as exc:
                    if "RESOURCE_EXHAUSTED" in str(exc):
                        break
                finally:
                    probe.close()
                assert time.monotonic() < deadline, "the silent streams were never all open"
                time.sleep(0.2)
            time.sleep(ARBITRATION_WAIT + 2)
        later = SwitchConnection("later", fresh.target.grpc_addr, 1, election_id=(0, 10))
        try:
            with pytest.raises(ControlError, match="not primary"):  # served: a backup
                later.arbitrate()
        finally:
            later.close()
        if fresh.kind == "embedded":  # closed, with the reason
            for call in silent:
                assert _stream_end(call) == (0, grpc.StatusCode.FAILED_PRECONDITION)
    finally:
        quiet.set()
        for call in silent:
            call.cancel()
    fresh.conn.read_counter("MyIngress.drops")  # the primary is still served


def test_a_client_that_never_reads_its_stream_cannot_grow_the_switch(fresh):
    """A backup sends PacketOuts and reads nothing. The embedded switch has no CPU port
    and answers each with an error message; it keeps at most ``OUTBOX`` of them for
    the client, then ends the stream with RESOURCE_EXHAUSTED and reads no more of it.
    BMv2 (no CPU port either) answers PacketOuts with nothing (pinned). The client's
    receive window stays gRPC's 64 kB (no BDP probing), so what the client does not
    read backs up into the switch whatever the machine's speed."""
    limit = 20000 if fresh.kind == "bmv2" else 1_000_000
    sent, stop = [0], threading.Event()

    def flood():
        yield _arbitration(11)
        while sent[0] < limit and not stop.is_set():
            p = p4runtime_pb2.StreamMessageRequest()
            p.packet.payload = b"\x00" * 64
            sent[0] += 1
            yield p
        stop.wait(90)

    channel = grpc.insecure_channel(fresh.target.grpc_addr,
                                    options=[("grpc.http2.bdp_probe", 0)])
    call = p4runtime_pb2_grpc.P4RuntimeStub(channel).StreamChannel(flood())
    try:
        deadline = time.monotonic() + 90
        if fresh.kind == "embedded":
            while "does not read it" not in fresh.target.log_path.read_text():
                assert time.monotonic() < deadline, "the stream of a client that reads " \
                                                    "nothing was never closed"
                time.sleep(0.2)
        else:
            while sent[0] < limit:
                assert time.monotonic() < deadline, "BMv2 stopped reading the PacketOuts"
                time.sleep(0.2)
        stop.set()  # the client ends its side and reads what came
        got, code = _stream_end(call)
    finally:
        stop.set()
        call.cancel()
        channel.close()
    if fresh.kind == "bmv2":
        assert (got, code) == (1, None)  # the arbitration answer alone
    else:
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and 1 <= got < sent[0]
        assert "does not read its stream" in call.details()
    fresh.conn.read_counter("MyIngress.drops")  # the primary is still served


def test_a_ctrl_c_while_waiting_for_a_switch_leaves_no_thread_to_fail_at_close(monkeypatch):
    """A signal (Ctrl-C; SIGTERM does the same) while the harness waits for a switch's
    server: no thread of gRPC's is left polling the channel, which a close then made
    raise "Channel closed!" (a traceback `bench switch` printed when stopped during
    bring-up, once in CI)."""
    import os
    import signal

    def pollers():  # gRPC's connectivity-polling threads (their arguments say so)
        return [t for t in threading.enumerate() if any(
            type(a).__name__ == "_ChannelConnectivityState" for a in getattr(t, "_args", ()))]

    failures = []
    monkeypatch.setattr(threading, "excepthook", failures.append)
    conn = SwitchConnection("nobody", f"127.0.0.1:{free_port()}", 1)  # nothing listens
    threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
    with pytest.raises(KeyboardInterrupt):
        conn.wait_ready(timeout=10)
        time.sleep(10)  # reached only if the wait ended early
    assert pollers() == []
    conn.close()
    time.sleep(0.5)  # longer than gRPC's connectivity poll (0.2 s)
    assert failures == []


def test_waiting_for_a_switch_writes_nothing_to_the_request_log(tmp_path):
    """The readiness probe is no request of the run: a switch slow to start must not
    leave DEADLINE_EXCEEDED errors in its p4runtime log."""
    log = tmp_path / "p4runtime-s1.log"
    conn = SwitchConnection("nobody", f"127.0.0.1:{free_port()}", 1, log_path=log)
    assert not conn.wait_ready(timeout=0.3) and not conn.wait_ready(timeout=0.3)
    conn.close()
    assert "Capabilities" not in log.read_text() and "ERROR" not in log.read_text()


def test_request_bodies_that_do_not_parse_are_refused_without_flooding_the_log(fresh):
    """Any client that reaches the port can send junk: each request is refused, the
    switch logs the first few whole and then one line a minute for the rest."""
    channel = grpc.insecure_channel(fresh.target.grpc_addr)
    write = channel.unary_unary("/p4.v1.P4Runtime/Write", request_serializer=lambda b: b,
                                response_deserializer=lambda b: b)
    junk = b"\x0a\xff\xff\xff\xff\x0f\x01"  # a length-delimited field cut short
    before = fresh.target.log_path.read_text().count("Traceback")
    for _ in range(40):
        with pytest.raises(grpc.RpcError) as err:
            write(junk, timeout=10)
        assert err.value.code() == grpc.StatusCode.INTERNAL
    channel.close()
    if fresh.kind != "embedded":  # BMv2 logs its own way
        return
    text = fresh.target.log_path.read_text()
    assert text.count("Traceback") - before <= 5
    assert "more like it are held back: one line a minute" in text
    fresh.conn.insert("MyIngress.aggregator_addr", {"hdr.ipv4.dstAddr": 9},
                      "MyIngress.accept_qaina")  # and goes on serving


#: entity kinds qaina.p4 has none of
ABSENT_KINDS = ["meter_entry", "direct_counter_entry", "direct_meter_entry",
                "action_profile_member", "action_profile_group"]


def test_a_read_of_the_whole_forwarding_state_gives_what_the_program_has(fresh):
    """One Read with a wildcard of every entity kind (spec, "Wildcard Reads"): the kinds
    the program has none of give nothing, not an error."""
    conn = fresh.conn
    conn.insert("MyIngress.aggregator_addr", {"hdr.ipv4.dstAddr": 9}, "MyIngress.accept_qaina")
    req = p4runtime_pb2.ReadRequest(device_id=1)
    # BMv2 serves no register reads, nor direct resources of all tables at once
    # (UNIMPLEMENTED, p4/README.md "P4Runtime servers")
    embedded = fresh.kind == "embedded"
    present = ["table_entry", "counter_entry"] + (["register_entry"] if embedded else [])
    absent = [k for k in ABSENT_KINDS if embedded or not k.startswith("direct_")]
    for kind in present + absent:
        wildcard(req.entities.add(), kind)
    got = [e.WhichOneof("entity") for r in conn.stub.Read(req, timeout=60) for e in r.entities]
    assert set(present) <= set(got)
    assert not set(got) & set(ABSENT_KINDS)
    for kind in ABSENT_KINDS:  # each alone
        if kind in absent:
            assert conn._read(kind, wildcard(p4runtime_pb2.Entity(), kind)) == []
        else:
            with pytest.raises(ControlError, match="UNIMPLEMENTED: Reading all direct"):
                conn._read(kind, wildcard(p4runtime_pb2.Entity(), kind))


def wildcard(entity, kind: str):
    """``entity`` as a wildcard of ``kind``: a direct resource's with its table entry
    present, table id 0 (BMv2 refuses one without: "Missing table_entry field")."""
    part = getattr(entity, kind)
    part.SetInParent()
    if kind.startswith("direct_"):
        part.table_entry.SetInParent()
    return entity


def test_a_write_of_an_atomicity_the_spec_lacks_is_refused(fresh):
    """ROLLBACK_ON_ERROR and DATAPLANE_ATOMIC are optional (UNIMPLEMENTED here); a value
    that is none of the spec's is INVALID_ARGUMENT."""
    conn = fresh.conn
    codes = {}
    for atomicity in (1, 2, 99):
        req = p4runtime_pb2.WriteRequest(device_id=1, atomicity=atomicity)
        req.election_id.high, req.election_id.low = conn.election_id
        req.updates.add().CopyFrom(p4runtime_pb2.Update(
            type=p4runtime_pb2.Update.INSERT, entity=p4runtime_pb2.Entity(
                table_entry=conn.table_entry("MyIngress.aggregator_addr",
                                             {"hdr.ipv4.dstAddr": 9}, "MyIngress.accept_qaina"))))
        with pytest.raises(grpc.RpcError) as err:
            conn.stub.Write(req, timeout=10)
        codes[atomicity] = err.value.code().name
    # BMv2 gives UNIMPLEMENTED for any value but CONTINUE_ON_ERROR
    assert codes == {1: "UNIMPLEMENTED", 2: "UNIMPLEMENTED",
                     99: "INVALID_ARGUMENT" if fresh.kind == "embedded" else "UNIMPLEMENTED"}
    assert conn.read_table("MyIngress.aggregator_addr") == []
