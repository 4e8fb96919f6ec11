"""The harness's side of the collective modes (``hosts/collective.py``'s ``MODES``):
a run's mode and whether a mode aggregates in the switch. ``--mode`` takes its choices
from the registry (``settings.py``), so a mode a package registers is a choice at once."""

from __future__ import annotations

from ..hosts.collective import MODES, Mode, congestion_asked  # noqa: F401 (for the harness)
from ..plugins import PluginError


def mode_of(cfg) -> Mode:
    """The ``Mode`` of a run configuration (PluginError naming the choices if unknown)."""
    return MODES.get(cfg.workload.mode)


def in_switch(name: str) -> bool:
    """Whether the mode called ``name`` aggregates in the switch (False for a mode no
    longer installed: an old result set still reads)."""
    try:
        return MODES.get(name).in_switch
    except PluginError:
        return False
