"""One switch, every host on it."""

from __future__ import annotations

from .base import LinkParams, QainaTopo


class StarTopo(QainaTopo):
    """``hosts`` hosts on switch ``s1``, which aggregates."""

    def build(self, hosts: int = 4, link: LinkParams = LinkParams(), **_):
        s1 = self.addSwitch("s1")
        for i in range(1, hosts + 1):
            self.addLink(self.addWorker(i), s1, **link.opts())
        self.aggregator = "s1"
