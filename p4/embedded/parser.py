"""``MyParser`` of ``qaina.p4`` for the embedded switch: what it reads of a frame.

The pipeline reads frame bytes 12 .. 53 (EtherType to the end of the QAINA header)
with one struct: the fields the parser selects on and the ingress checks read, the
others skipped. In ``qaina.p4`` terms: ``etherType``; ``version/ihl``,
``totalLen``, ``flags/fragOffset``, ``ttl``, ``protocol``, ``srcAddr``,
``dstAddr``; UDP ``dstPort``, ``length_``; every QAINA field.
"""

from __future__ import annotations

import struct

from ..header import ETH_TYPE, PAYLOAD_OFFSET, QAINA_STRUCT, QAINA_UDP_PORT

HEADERS = struct.Struct("!HBxHxxHBBxxIIxxHHxx" + QAINA_STRUCT.format.lstrip("!@=<>"))
assert ETH_TYPE + HEADERS.size == PAYLOAD_OFFSET

ETHERTYPE_IPV4 = 0x0800
IP_PROTO_UDP = 17
#: the IPv4 flags/fragOffset bits that make a fragment (MF set, or an offset)
FRAGMENT = 0x3FFF


def parses_qaina(h: tuple) -> bool:
    """Whether ``MyParser`` extracts the QAINA header of a frame with ``HEADERS`` ``h``
    (IPv4 without options, not a fragment, UDP to the QAINA port)."""
    return (h[1] & 0x0F == 5 and not h[3] & FRAGMENT and h[5] == IP_PROTO_UDP
            and h[8] == QAINA_UDP_PORT)
