"""The harness's side of the collective modes (``hosts/collective.py``'s ``MODES``):
a run's mode, and ``--mode`` choices read from the registry when first needed, so a
mode an installed package registers is a choice at once."""

from __future__ import annotations

import click

from ..hosts.collective import MODES, Mode
from ..plugins import PluginError


def mode_of(cfg) -> Mode:
    """The ``Mode`` of a run configuration (PluginError naming the choices if unknown)."""
    return MODES.get(cfg.mode)


def in_switch(name: str) -> bool:
    """Whether the mode called ``name`` aggregates in the switch (False for a mode no
    longer installed: an old result set still reads)."""
    try:
        return MODES.get(name).in_switch
    except PluginError:
        return False


class ModeChoice(click.Choice):
    """``--mode``: a choice of the registered modes, read when first needed."""

    name = "mode"

    def __init__(self):
        super().__init__(())

    @property
    def choices(self):
        return MODES.names()

    @choices.setter
    def choices(self, value):
        pass  # the registry's names, always

    def get_metavar(self, param, ctx=None):
        return "[" + "|".join(self.choices) + "]"
