"""The names of the interfaces a topology's links will have, known before they exist:
checked free before a run, and listed in its record before the network is built."""

from __future__ import annotations

from pathlib import Path

from ..config import ConfigError


def planned_interfaces(topo) -> list[str]:
    """Both ends of every link of ``topo`` (a Mininet ``Topo``), as Mininet names them
    (``node-ethPORT``)."""
    out = []
    for _, _, _, info in topo.links(withKeys=True, withInfo=True):
        out += [f"{info['node1']}-eth{info['port1']}", f"{info['node2']}-eth{info['port2']}"]
    return out


def check_names_free(topo_name: str, topo):
    """Refuse to start when an interface the topology's switches will create exists
    already (left by a run without a record, or another program)."""
    switches = set(topo.switches())
    taken = sorted(p.name for p in Path("/sys/class/net").iterdir()
                   if p.name.split("-eth")[0] in switches and "-eth" in p.name)
    if taken:
        raise ConfigError(f"interface {taken[0]} exists already ({len(taken)} of the "
                          f"{topo_name} switches' names are taken): run `qaina-bench clean`, "
                          f"or remove them with `ip link del {taken[0]}`")
