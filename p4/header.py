"""The QAINA header, declared once.

``QAINA_FIELDS`` is the one definition of the aggregation header. Everything else is
derived from it: the struct format of the hosts' fast path, the lengths and numpy
dtype of whole packets for each payload size the data plane is built for (``Wire``), the scapy layer (``QAINA``, bound to UDP port ``QAINA_UDP_PORT``) and the
P4 ``header qaina_h`` text that ``qaina.p4`` must contain (a test checks it does), and
the Wireshark dissector (``p4/wireshark.py``).

Wire layout of an aggregation packet::

    Ethernet(14) / IPv4(20, no options) / UDP(8, dport QAINA_UDP_PORT) /
    QAINA(12) / payload: QAINA_WORDS x 32-bit words, network byte order

The fields:

* ``job_id``  which job (a key of the switch's ``job_table``);
* ``worker``  sender's worker index (``0..n-1``); on results, the receiver's index; on
              a shared job's complete sum going to its fallback host,
              ``FALLBACK_WORKER``;
* ``flags``   ``FLAG_RESULT`` on switch-to-worker results, ``FLAG_RETX`` when a worker
              resends a contribution after a timeout, ``FLAG_FALLBACK`` on a worker's
              contribution that the switch diverts to its job's fallback host (shared
              allocation: the slot copy was held by another use);
* ``slot``    slot in the switch's shared pool (absolute, inside the job's range);
* ``ver``     which of the slot's two copies (0/1); a worker flips it on every reuse;
* ``exp``     signed scale exponent: a worker piggy-backs the exponent of the chunk it
              will send next in this slot; results carry the maximum over the workers;
* ``seq``     chunk sequence number in the job's stream (echoed on results).
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass

import numpy as np

QAINA_UDP_PORT = 20801
QAINA_WORDS = 32  # payload words per packet by default; see p4/README.md for why 32
#: the payload sizes the data plane is built for (``p4/program.py``); 256 words keep a
#: frame (1078 bytes) under a 1500-byte MTU
PAYLOAD_WORDS = (32, 64, 128, 256)

FLAG_RESULT = 0x01
FLAG_RETX = 0x02
#: shared allocation: a contribution the switch sent on to the job's fallback host as
#: a single (its copy was another use's, or given up); ``worker`` stays the sender's
FLAG_FALLBACK = 0x04
#: shared allocation: the worker index a switch's complete sum carries to the job's
#: fallback host (``set_upstream``'s ``worker`` of a shared job)
FALLBACK_WORKER = 255
#: shared allocation: on a packet from the fallback host, asks the switch for the partial
#: sum of the chunk that completes the singles the host holds (their workers' bitmap in
#: payload word 0); the switch answers with worker ``FALLBACK_PARTIAL``
FLAG_FLUSH = 0x08
FALLBACK_PARTIAL = 254

ETH_LEN, IPV4_LEN, UDP_LEN = 14, 20, 8


@dataclass(frozen=True)
class Flag:
    """One bit of the ``flags`` field: name, mask, meaning."""

    name: str
    mask: int
    doc: str = ""


#: the bits of ``flags``, lowest first (the scapy layer and the Wireshark dissector
#: name them from here)
QAINA_FLAGS = (
    Flag("RESULT", FLAG_RESULT, "a result: the switch's sum going to a worker"),
    Flag("RETX", FLAG_RETX, "a worker's contribution sent again after a timeout"),
    Flag("FALLBACK", FLAG_FALLBACK, "a contribution the switch diverted to the job's "
         "fallback host"),
    Flag("FLUSH", FLAG_FLUSH, "the fallback host asks for the partial sum of a chunk"),
)
assert [f.mask for f in QAINA_FLAGS] == [1 << i for i in range(len(QAINA_FLAGS))]

@dataclass(frozen=True)
class Field:
    """One header field: name, width in bits, signedness, meaning."""

    name: str
    bits: int
    signed: bool = False
    doc: str = ""


QAINA_FIELDS = (
    Field("job_id", 16, doc="job id, key of job_table"),
    Field("worker", 8, doc="worker index of the sender (results: of the receiver)"),
    Field("flags", 8, doc="bits of QAINA_FLAGS: RESULT, RETX, FALLBACK, FLUSH"),
    Field("slot", 16, doc="slot in the shared pool"),
    Field("ver", 8, doc="slot copy 0/1, flipped on every reuse of the slot"),
    Field("exp", 8, signed=True, doc="scale exponent (next chunk's / agreed maximum)"),
    Field("seq", 32, doc="chunk sequence number in the job's stream"),
)

_STRUCT_CODE = {(8, False): "B", (8, True): "b", (16, False): "H", (16, True): "h",
                (32, False): "I", (32, True): "i"}
_NUMPY_CODE = {(8, False): "u1", (8, True): "i1", (16, False): ">u2", (16, True): ">i2",
               (32, False): ">u4", (32, True): ">i4"}

FIELD_NAMES = tuple(f.name for f in QAINA_FIELDS)
QAINA_STRUCT = struct.Struct("!" + "".join(_STRUCT_CODE[f.bits, f.signed] for f in QAINA_FIELDS))
QAINA_LEN = QAINA_STRUCT.size
#: byte offset of each field in the header
FIELD_OFFSETS = {f.name: sum(g.bits for g in QAINA_FIELDS[:i]) // 8
                 for i, f in enumerate(QAINA_FIELDS)}
PAYLOAD_LEN = 4 * QAINA_WORDS
UDP_TOTAL_LEN = UDP_LEN + QAINA_LEN + PAYLOAD_LEN  # value of udp.length_
IPV4_TOTAL_LEN = IPV4_LEN + UDP_TOTAL_LEN  # value of ipv4.totalLen
FRAME_LEN = ETH_LEN + IPV4_TOTAL_LEN
QAINA_OFFSET = ETH_LEN + IPV4_LEN + UDP_LEN  # header offset in a frame
PAYLOAD_OFFSET = QAINA_OFFSET + QAINA_LEN

# Where the fields a switch reads or rewrites sit in a whole frame (IPv4 without
# options): byte offsets, and slices for the multi-byte ones.
ETH_DST, ETH_SRC, ETH_TYPE = slice(0, 6), slice(6, 12), 12
IP_VIHL, IP_TOTAL_LEN, IP_FLAGS_FRAG, IP_TTL, IP_PROTO, IP_CSUM = 14, 16, 20, 22, 23, 24
IP_SRC, IP_DST = slice(26, 30), slice(30, 34)
UDP_DPORT, UDP_LENGTH, UDP_CSUM = 36, 38, slice(40, 42)
#: offset of each QAINA field in a whole frame
QAINA_AT = {name: QAINA_OFFSET + off for name, off in FIELD_OFFSETS.items()}



@dataclass(frozen=True)
class Wire:
    """The lengths of an aggregation packet whose payload is ``words`` 32-bit words
    (one build of the data plane; ``wire(words)`` checks the size)."""

    words: int = QAINA_WORDS

    @property
    def payload_len(self) -> int:
        return 4 * self.words

    @property
    def udp_len(self) -> int:
        """value of udp.length_"""
        return UDP_LEN + QAINA_LEN + self.payload_len

    @property
    def ipv4_len(self) -> int:
        """value of ipv4.totalLen"""
        return IPV4_LEN + self.udp_len

    @property
    def frame_len(self) -> int:
        return ETH_LEN + self.ipv4_len

    @property
    def datagram_len(self) -> int:
        """bytes of a UDP payload: the header and the words"""
        return QAINA_LEN + self.payload_len

    @property
    def dtype(self) -> np.dtype:
        """numpy dtype of the QAINA header followed by its payload (a UDP payload)"""
        return np.dtype([(f.name, _NUMPY_CODE[f.bits, f.signed]) for f in QAINA_FIELDS]
                        + [("words", ">u4", (self.words,))])

    def datagram(self, words, **fields) -> bytes:
        """A whole UDP payload: header fields (missing ones are 0) and the payload words."""
        values = [fields.pop(name, 0) for name in FIELD_NAMES]
        if fields:
            raise TypeError(f"unknown QAINA fields: {sorted(fields)}")
        words = np.asarray(words, dtype=">u4")
        if words.shape != (self.words,):
            raise ValueError(f"a QAINA payload is {self.words} words, got {words.shape}")
        return QAINA_STRUCT.pack(*values) + words.tobytes()


def wire(words: int = QAINA_WORDS) -> Wire:
    """The ``Wire`` of a data plane build; ValueError for a size it is not built for."""
    if isinstance(words, bool) or words not in PAYLOAD_WORDS:
        raise ValueError(f"payload words must be one of {', '.join(map(str, PAYLOAD_WORDS))}, "
                         f"got {words!r}")
    return Wire(int(words))


DEFAULT_WIRE = Wire(QAINA_WORDS)
#: numpy dtype of the QAINA header followed by its default payload
QAINA_DTYPE = DEFAULT_WIRE.dtype
assert QAINA_DTYPE.itemsize == QAINA_LEN + PAYLOAD_LEN


_IPV4_WORDS = struct.Struct("!10H")


def ipv4_checksum(buf, offset: int = ETH_LEN) -> int:
    """csum16 over the 20-byte IPv4 header at ``offset`` (checksum field as zero)."""
    words = _IPV4_WORDS.unpack_from(buf, offset)
    s = sum(words) - words[5]
    s = (s & 0xFFFF) + (s >> 16)
    s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


def pack_header(job_id, worker, flags, slot, ver, exp, seq) -> bytes:
    """The 12 header bytes (hosts' fast path)."""
    return QAINA_STRUCT.pack(job_id, worker, flags, slot, ver, exp, seq)


def unpack_header(buf, offset: int = 0) -> dict:
    """Header fields of ``buf`` at ``offset`` as a dict."""
    return dict(zip(FIELD_NAMES, QAINA_STRUCT.unpack_from(buf, offset)))


def datagram(words, **fields) -> bytes:
    """A whole UDP payload of the default build (see ``Wire.datagram``)."""
    return DEFAULT_WIRE.datagram(words, **fields)


def p4_header_text(name: str = "qaina_h") -> str:
    """The P4_16 declaration of the header, as ``qaina.p4`` spells it."""
    lines = [f"header {name} {{"]
    lines += [f"    bit<{f.bits}> {f.name};" for f in QAINA_FIELDS]
    lines.append("}")
    return "\n".join(lines)


def p4_header_fields(p4_source: str, name: str):
    """``[(field, bits)]`` of ``header name { ... }`` in a P4 source text."""
    m = re.search(r"header\s+%s\s*\{(.*?)\}" % re.escape(name), p4_source, re.S)
    if not m:
        raise LookupError(f"no header {name} in the P4 source")
    body = re.sub(r"//[^\n]*", "", m.group(1))
    return [(fname, int(bits)) for bits, fname in
            re.findall(r"bit<(\d+)>\s+(\w+)\s*;", body)]


def scapy_layer():
    """The scapy ``QAINA`` layer class, bound to UDP port ``QAINA_UDP_PORT``.

    Built on first use so the hosts' fast path does not import scapy.
    """
    global _SCAPY
    if _SCAPY is None:
        _SCAPY = _build_scapy_layer()
    return _SCAPY


_SCAPY = None


def _build_scapy_layer():
    from scapy.fields import (ByteField, FieldListField, FlagsField, IntField,
                              ShortField, SignedByteField, XIntField)
    from scapy.layers.inet import UDP
    from scapy.packet import Packet, bind_layers

    def field(f: Field):
        if f.name == "flags":
            return FlagsField(f.name, 0, f.bits, [flag.name for flag in QAINA_FLAGS])
        if f.bits == 8:
            return SignedByteField(f.name, 0) if f.signed else ByteField(f.name, 0)
        if f.bits == 16:
            return ShortField(f.name, 0)
        return IntField(f.name, 0)

    class QAINA(Packet):
        name = "QAINA"
        # The words run to the end of the datagram: every build's payload parses.
        fields_desc = [field(f) for f in QAINA_FIELDS] + [
            FieldListField("words", [0] * QAINA_WORDS, XIntField("", 0),
                           max_count=max(PAYLOAD_WORDS))]

    bind_layers(UDP, QAINA, dport=QAINA_UDP_PORT)
    return QAINA
