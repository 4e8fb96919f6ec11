"""A two-tier Clos: every leaf linked to every spine, hosts on the leaves."""

from __future__ import annotations

from .base import LinkParams, QainaTopo
from .params import Param


class LeafSpineTopo(QainaTopo):
    """``spines`` spines ``sp1..``, ``leaves`` leaves ``lf1..``, hosts spread over the
    leaves in turn (``h1`` on ``lf1``, ``h2`` on ``lf2``, ...). Spine ``sp1``
    aggregates every job: each contribution crosses leaf and spine, each result comes
    back down, and all other traffic takes a shortest path."""

    params = (Param("spines", int, 2, "spine switches", low=1, high=64),
              Param("leaves", int, 2, "leaf switches", low=1, high=64))

    def build(self, hosts: int = 4, link: LinkParams = LinkParams(), spines: int = 2,
              leaves: int = 2, **_):
        if spines < 1 or leaves < 1:
            raise ValueError("a leaf-spine needs at least one spine and one leaf")
        sp = [self.addSwitch(f"sp{k}") for k in range(1, spines + 1)]
        lf = [self.addSwitch(f"lf{k}") for k in range(1, leaves + 1)]
        for leaf in lf:
            for spine in sp:
                self.addLink(leaf, spine, **link.opts())
        for i in range(1, hosts + 1):
            self.addLink(self.addWorker(i), lf[(i - 1) % leaves], **link.opts())
        self.aggregator = "sp1"
