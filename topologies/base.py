"""What every testbed topology has: numbered hosts with fixed addresses, link
parameters for TCLink, and a designated aggregating switch."""

from __future__ import annotations

from dataclasses import dataclass

from mininet.topo import Topo

from .params import Param

#: link rates the testbed shapes, Mbit/s (Mininet writes a rate with 6 decimals: a far
#: smaller one becomes 0, which tc refuses; 1000 is the most Mininet's TCLink takes)
MIN_BW, MAX_BW = 0.001, 1000


@dataclass(frozen=True)
class LinkParams:
    """TCLink parameters; None leaves the property unshaped."""

    bw: float | None = None  # Mbit/s
    delay: str | None = None  # e.g. "1ms"
    loss: float | None = None  # percent

    def opts(self) -> dict:
        return {k: v for k, v in (("bw", self.bw), ("delay", self.delay), ("loss", self.loss))
                if v is not None}


def host_ip(i: int) -> str:
    return f"10.0.{i // 256}.{i % 256}"


def host_mac(i: int) -> str:
    return "00:00:00:00:{:02x}:{:02x}".format(i // 256, i % 256)


class QainaTopo(Topo):
    """Base class: ``addWorker`` adds host ``h<i>``, ``addSwitch`` gives every switch
    the next P4Runtime device id (from 1); ``aggregator`` is set by subclasses.

    A subclass declares its own parameters once in ``params``; ``build`` gets them as
    keyword arguments, next to ``hosts`` (how many hosts the run needs) and ``link``
    (every link's TCLink parameters)."""

    aggregator = "s1"
    params: tuple[Param, ...] = ()

    def build(self, hosts: int = 4, link: LinkParams = LinkParams(), **_):
        raise NotImplementedError

    def addWorker(self, i: int) -> str:
        return self.addHost(f"h{i}", ip=f"{host_ip(i)}/8", mac=host_mac(i))

    def addSwitch(self, name: str, **opts) -> str:
        opts.setdefault("device_id", len(self.switches()) + 1)
        return super().addSwitch(name, **opts)

    def device_id(self, switch: str) -> int:
        return self.nodeInfo(switch)["device_id"]

    def job_hosts(self, jobs: int, workers: int) -> list[list[str]]:
        """The hosts of each job: consecutive workers (``h1..hW`` job 1, ...)."""
        hosts = sorted(self.hosts(), key=lambda h: int(h[1:]))
        if jobs * workers > len(hosts):
            raise ValueError(f"{jobs} jobs x {workers} workers need {jobs * workers} hosts, "
                             f"the topology has {len(hosts)}")
        return [hosts[j * workers:(j + 1) * workers] for j in range(jobs)]

    def server_hosts(self, jobs: int, workers: int) -> list[str]:
        """The parameter server of each job (``--mode ps``): the hosts after the
        workers, one per job."""
        hosts = sorted(self.hosts(), key=lambda h: int(h[1:]))[jobs * workers:]
        if len(hosts) < jobs:
            raise ValueError(f"{jobs} parameter servers need {jobs} hosts beyond the workers")
        return hosts[:jobs]
