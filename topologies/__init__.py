"""Mininet topologies of the testbed: ``star``, ``dumbbell``, ``leafspine`` and what
plugins add.

Each is a ``QainaTopo`` (a ``mininet.topo.Topo``) whose hosts are ``h1..hN``
(10.0.0.i/8), whose switches run the QAINA data plane, and which declares its own
parameters in ``params``. ``aggregator`` names the switch where jobs are aggregated;
the harness routes everything else over the fabric by IPv4 LPM. ``TOPOLOGIES`` is the
registry (``--topo`` takes its names); out-of-tree topologies join it through the
``qaina_bench.topologies`` entry-point group (docs/extending.md).
"""

from __future__ import annotations

from ..plugins import Registry
from .base import LinkParams, QainaTopo
from .dumbbell import DumbbellTopo
from .leafspine import LeafSpineTopo
from .params import Param, TopologyError, TopoSpec, declared, parse_topo as _parse
from .star import StarTopo

TOPOLOGIES: Registry = Registry("topology", "qaina_bench.topologies")
TOPOLOGIES.add("star", StarTopo)
TOPOLOGIES.add("dumbbell", DumbbellTopo)
TOPOLOGIES.add("leafspine", LeafSpineTopo)


def parse_topo(text: str, fallback: dict | None = None) -> TopoSpec:
    """``--topo`` text (``leafspine``, ``leafspine,2,4``, ``leafspine,leaves=4``) as a
    TopoSpec of a registered topology; TopologyError (one line) if it cannot be built.
    ``fallback`` gives values for parameters the text leaves out (the ``--spines`` and
    ``--leaves`` aliases)."""
    spec = _parse(text, TOPOLOGIES, fallback)
    if not (isinstance(spec.cls, type) and issubclass(spec.cls, QainaTopo)):
        raise TopologyError(f"topology {spec.name!r} ({TOPOLOGIES.origin(spec.name)}) is "
                            "not a QainaTopo subclass")
    return spec


__all__ = ["TOPOLOGIES", "LinkParams", "QainaTopo", "StarTopo", "DumbbellTopo",
           "LeafSpineTopo", "Param", "TopoSpec", "TopologyError", "declared", "parse_topo"]
