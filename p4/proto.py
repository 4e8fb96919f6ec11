"""The P4Runtime protobuf messages and gRPC stubs, for everything that speaks P4Runtime.

This is the one module that names the package providing them (p4/README.md,
"Protobuf": which one and why); the harness, the sampler, the embedded switch and the
tests import ``p4runtime_pb2``, ``p4runtime_pb2_grpc``, ``p4info_pb2``, ``code_pb2``,
``status_pb2`` and ``text_format`` from here.
"""

from __future__ import annotations

from google.protobuf import __version__ as PROTOBUF_VERSION
from google.protobuf import text_format
from google.protobuf.internal import api_implementation

from finsy.proto import p4i as p4info_pb2
from finsy.proto import p4r as p4runtime_pb2
from finsy.proto import p4r_grpc as p4runtime_pb2_grpc
from finsy.proto import rpc_code as code_pb2
from finsy.proto import rpc_status as status_pb2

#: the distribution that ships the generated modules (for version reports)
PROVIDER = "finsy"

__all__ = ["p4info_pb2", "p4runtime_pb2", "p4runtime_pb2_grpc", "code_pb2", "status_pb2",
           "text_format", "implementation", "PROTOBUF_VERSION", "PROVIDER"]


def implementation() -> str:
    """Which protobuf runtime parses and builds messages: ``upb``, ``cpp`` or ``python``
    (pure Python, some 25 times slower on large reads)."""
    return api_implementation.Type()
