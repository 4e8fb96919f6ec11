"""The embedded switch: ``qaina.p4`` in software, served over P4Runtime.

``pipeline.py`` is the data plane (parser, ingress, PRE, egress), ``runtime.py`` the
P4Runtime server, ``ports.py`` the AF_PACKET ports, ``loop.py`` their receive loop,
``__main__.py`` the command line.
"""

from __future__ import annotations

from .pipeline import Pipeline
from .loop import PortSet
from .runtime import Device, serve


class EmbeddedSwitch:
    """Ports, a P4Runtime device and its server, wired together."""

    def __init__(self, interfaces: dict[int, str], device_id: int = 1,
                 grpc_addr: str = "127.0.0.1:9559", coalesce_s: float | None = None):
        self.ports = PortSet(interfaces, coalesce_s=coalesce_s)
        self.device = Device(device_id, self._make_pipeline)
        try:
            self.server, port = serve(self.device, grpc_addr)
            #: where it answers P4Runtime (the port the kernel chose when given 0)
            self.grpc_addr = f"{grpc_addr.rpartition(':')[0]}:{port}"
        except Exception:
            self.ports.close()
            raise

    def _make_pipeline(self, p4info):
        return Pipeline(p4info, tx=self.ports.send, port_tx=self.ports.port)

    def run(self):
        self.ports.run(self.device)

    def stop(self):
        self.ports.stop()

    def close(self):
        self.server.stop(grace=0.5)
        self.ports.close()
