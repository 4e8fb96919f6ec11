"""The QAINA header's three faces agree bit for bit: struct fast path, scapy layer,
numpy dtype, and the ``header qaina_h`` of qaina.p4."""

from __future__ import annotations

import numpy as np
import pytest
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether

from qaina_bench.p4 import header
from qaina_bench.p4.p4info import P4_SOURCE

pytestmark = pytest.mark.smoke

FIELDS = dict(job_id=0xBEEF, worker=17, flags=header.FLAG_RESULT | header.FLAG_RETX,
              slot=1023, ver=1, exp=-3, seq=0xDEADBEEF)
WORDS = np.arange(header.QAINA_WORDS, dtype=np.uint32) * 0x01010101


def test_p4_header_matches_the_definition():
    src = P4_SOURCE.read_text()
    assert header.p4_header_text() in src
    assert header.p4_header_fields(src, "qaina_h") == [(f.name, f.bits) for f in header.QAINA_FIELDS]
    words = header.p4_header_fields(src, "payload_h")
    assert words == [(f"w{i}", 32) for i in range(header.QAINA_WORDS)]


def test_struct_scapy_and_numpy_agree_bit_for_bit():
    fast = header.datagram(WORDS, **FIELDS)
    QAINA = header.scapy_layer()
    assert bytes(QAINA(**FIELDS, words=[int(w) for w in WORDS])) == fast
    rec = np.frombuffer(fast, dtype=header.QAINA_DTYPE)[0]
    for name, value in FIELDS.items():
        assert int(rec[name]) == value
    assert np.array_equal(rec["words"], WORDS)
    assert header.unpack_header(fast) == FIELDS
    parsed = QAINA(fast)
    assert {k: parsed.getfieldval(k) for k in FIELDS} == {**FIELDS, "flags": parsed.flags}
    assert int(parsed.flags) == FIELDS["flags"]


def test_each_field_sits_where_p4_puts_it():
    """Setting one field to all ones touches exactly that field's bits."""
    offset = 0
    for f in header.QAINA_FIELDS:
        ones = -1 if f.signed else (1 << f.bits) - 1
        values = {g.name: 0 for g in header.QAINA_FIELDS}
        values[f.name] = ones
        raw = int.from_bytes(header.pack_header(**values), "big")
        total = header.QAINA_LEN * 8
        expected = ((1 << f.bits) - 1) << (total - offset - f.bits)
        assert raw == expected, f.name
        offset += f.bits


def test_udp_port_binding_dissects_whole_frames():
    QAINA = header.scapy_layer()
    frame = (Ether() / IP(src="10.0.0.1", dst="10.255.0.1")
             / UDP(sport=header.QAINA_UDP_PORT, dport=header.QAINA_UDP_PORT)
             / QAINA(**FIELDS, words=[int(w) for w in WORDS]))
    raw = bytes(frame)
    assert len(raw) == header.FRAME_LEN
    assert raw[header.QAINA_OFFSET:] == header.datagram(WORDS, **FIELDS)
    again = Ether(raw)
    assert again.haslayer(QAINA) and again[QAINA].seq == FIELDS["seq"]


@pytest.mark.parametrize("words", header.PAYLOAD_WORDS)
def test_every_build_packs_and_parses_alike(words):
    """The lengths of each build, and its packets through struct, numpy and scapy."""
    w = header.wire(words)
    assert (w.payload_len, w.datagram_len) == (4 * words, header.QAINA_LEN + 4 * words)
    assert w.frame_len == header.ETH_LEN + header.IPV4_LEN + header.UDP_LEN + w.datagram_len
    assert w.frame_len <= 1514  # a 1500-byte MTU
    payload = np.arange(words, dtype=np.uint32) * 0x00010001
    fast = w.datagram(payload, **FIELDS)
    assert len(fast) == w.datagram_len
    rec = np.frombuffer(fast, dtype=w.dtype)[0]
    assert np.array_equal(rec["words"], payload) and int(rec["seq"]) == FIELDS["seq"]
    QAINA = header.scapy_layer()
    assert bytes(QAINA(**FIELDS, words=[int(x) for x in payload])) == fast
    assert QAINA(fast).words == [int(x) for x in payload]
    with pytest.raises(ValueError, match=f"{words} words"):
        w.datagram(payload[:-1])


@pytest.mark.parametrize("words", [0, 16, 33, 48, 512, True, "32"])
def test_only_built_payload_sizes_exist(words):
    with pytest.raises(ValueError, match="32, 64, 128, 256"):
        header.wire(words)


def test_datagram_rejects_bad_input():
    with pytest.raises(ValueError):
        header.datagram(np.zeros(3), job_id=1)
    with pytest.raises(TypeError):
        header.datagram(WORDS, jobid=1)
