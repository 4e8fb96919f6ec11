"""Two switches joined by one bottleneck link, hosts split between them."""

from __future__ import annotations

from dataclasses import replace

from .base import MAX_BW, MIN_BW, LinkParams, QainaTopo
from .params import Param


class DumbbellTopo(QainaTopo):
    """Hosts ``h1..`` alternate between ``s1`` and ``s2``; ``s1`` aggregates, so half
    of every job's contributions and results cross the ``s1``-``s2`` link, which
    ``bottleneck`` may make narrower than the others (``--topo dumbbell,bottleneck=10``)."""

    params = (Param("bottleneck", float, None, "Mbit/s of the s1-s2 link (default: "
                    "--bw, like every other link)", low=MIN_BW, high=MAX_BW),)

    def build(self, hosts: int = 4, link: LinkParams = LinkParams(),
              bottleneck: float | None = None, **_):
        s1, s2 = self.addSwitch("s1"), self.addSwitch("s2")
        for i in range(1, hosts + 1):
            self.addLink(self.addWorker(i), s1 if i % 2 else s2, **link.opts())
        middle = link if bottleneck is None else replace(link, bw=bottleneck)
        self.addLink(s1, s2, **middle.opts())
        self.aggregator = "s1"
