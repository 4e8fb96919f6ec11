"""Two switches joined by one bottleneck link, hosts split between them."""

from __future__ import annotations

from .base import LinkParams, QainaTopo


class DumbbellTopo(QainaTopo):
    """Hosts ``h1..`` alternate between ``s1`` and ``s2``; ``s1`` aggregates, so half
    of every job's contributions and results cross the ``s1``-``s2`` link."""

    def build(self, hosts: int = 4, link: LinkParams = LinkParams(),
              bottleneck: LinkParams | None = None, **_):
        s1, s2 = self.addSwitch("s1"), self.addSwitch("s2")
        for i in range(1, hosts + 1):
            self.addLink(self.addWorker(i), s1 if i % 2 else s2, **link.opts())
        self.addLink(s1, s2, **(bottleneck or link).opts())
        self.aggregator = "s1"
