"""The builds of ``qaina.p4``: one per payload size of ``header.PAYLOAD_WORDS``.

``qaina.p4`` is the 32-word build. ``source(words)`` renders another from it by
changing only what depends on the payload size: ``QAINA_WORDS``, ``POOL_WORDS``, the
two length constants, the ``payload_h`` header and the ``ALL_WORDS`` macro.
``p4info(words)`` is the committed P4Info with ``agg_sum`` sized for that build (the
one entity that changes; a test compares it with p4c's output for every build).
"""

from __future__ import annotations

import re
from functools import lru_cache

from .constants import POOL_COPIES
from .header import QAINA_WORDS, wire
from .p4info import P4_SOURCE, P4Info
from .proto import p4info_pb2


def _payload_header(words: int) -> str:
    fields = [f"bit<32> w{i};".ljust(12) for i in range(words)]
    rows = ["    " + " ".join(fields[i:i + 4]).rstrip() for i in range(0, words, 4)]
    return "header payload_h {\n" + "\n".join(rows) + "\n}"


def _all_words(words: int) -> str:
    ops = [f"OP({i})".ljust(6) for i in range(words)]
    rows = ["    " + " ".join(ops[i:i + 8]) for i in range(0, words, 8)]
    return "#define ALL_WORDS(OP) \\\n" + " \\\n".join(rows[:-1] + [rows[-1].rstrip()])


def _replace(text: str, pattern: str, new: str) -> str:
    out, n = re.subn(pattern, lambda m: new, text, count=1, flags=re.M)
    if n != 1:
        raise LookupError(f"qaina.p4 has no {pattern!r}: p4/program.py needs updating")
    return out


@lru_cache(maxsize=None)
def source(words: int = QAINA_WORDS) -> str:
    """The P4 text of the ``words``-word build."""
    w = wire(words)
    text = P4_SOURCE.read_text()
    text = _replace(text, r"^#define QAINA_WORDS \d+$", f"#define QAINA_WORDS {words}")
    text = _replace(text, r"^#define POOL_WORDS \d+", f"#define POOL_WORDS {POOL_COPIES * words}")
    text = _replace(text, r"QAINA_UDP_LEN = \d+;", f"QAINA_UDP_LEN = {w.udp_len};")
    text = _replace(text, r"QAINA_IPV4_LEN = \d+;", f"QAINA_IPV4_LEN = {w.ipv4_len};")
    text = _replace(text, r"^header payload_h \{\n(?:    .*\n)*\}", _payload_header(words))
    text = _replace(text, r"^#define ALL_WORDS\(OP\) \\\n(?:    .*\\\n)*    .*\)$",
                    _all_words(words))
    return text


@lru_cache(maxsize=None)
def p4info(words: int = QAINA_WORDS) -> P4Info:
    """The P4Info of the ``words``-word build."""
    wire(words)
    proto = p4info_pb2.P4Info()
    proto.CopyFrom(P4Info.load().proto)
    for reg in proto.registers:
        if reg.preamble.name == "MyIngress.agg_sum":
            reg.size = POOL_COPIES * words
    return P4Info(proto)


def words_of(info: P4Info) -> int | None:
    """The payload size of the build whose P4Info ``info`` is, None if it is none's."""
    size = info.register("agg_sum").size if info.registers else 0
    words, rest = divmod(size, POOL_COPIES)
    try:
        return words if not rest and p4info(words).proto == info.proto else None
    except ValueError:
        return None
