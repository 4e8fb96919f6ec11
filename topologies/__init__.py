"""Mininet topologies of the testbed: ``star``, ``dumbbell`` and ``leafspine``.

Each is a ``mininet.topo.Topo`` whose hosts are ``h1..hN`` (10.0.0.i/8) and whose
switches run the QAINA data plane. ``aggregator`` names the switch where jobs are
aggregated; the harness routes everything else over the fabric by IPv4 LPM.
"""

from __future__ import annotations

from .base import LinkParams, QainaTopo
from .dumbbell import DumbbellTopo
from .leafspine import LeafSpineTopo
from .star import StarTopo

TOPOLOGIES = {"star": StarTopo, "dumbbell": DumbbellTopo, "leafspine": LeafSpineTopo}

__all__ = ["TOPOLOGIES", "LinkParams", "QainaTopo", "StarTopo", "DumbbellTopo",
           "LeafSpineTopo"]
