"""The command line's view of the plugin registries (plugins.py): choices taken from
a registry when they are needed, and ``qaina-bench plugins``, which lists every
registered plugin with where it came from."""

from __future__ import annotations

import click

from ..hosts.compression import COMPRESSORS, QUANTIZERS
from ..plugins import PluginError
from ..topologies import TOPOLOGIES, declared
from .results.metrics import METRICS


class RegistryChoice(click.Choice):
    """A ``click.Choice`` whose choices are ``extra`` and the names of ``registry``,
    read when an option is checked or its help is shown, so plugins loaded through
    entry points are choices too; a plugin that does not load is one error line."""

    def __init__(self, registry, extra=()):
        self.registry, self.extra = registry, tuple(extra)
        super().__init__((), case_sensitive=True)

    @property
    def choices(self):
        try:
            return self.extra + self.registry.names()
        except PluginError as exc:
            raise click.UsageError(str(exc)) from None

    @choices.setter
    def choices(self, _value):
        """click.Choice sets its list; this one reads the registry instead."""


def registries() -> list[tuple[str, str, object]]:
    """(title, option, registry) of every kind of plugin the CLI takes."""
    return [("quantizers", "--quantizer", QUANTIZERS),
            ("compressors", "--compress", COMPRESSORS),
            ("topologies", "--topo", TOPOLOGIES),
            ("metrics", "summary.json, sweep.csv", METRICS)]


def describe(registry, name: str) -> str:
    """One plugin's line: its name, origin and, for a topology, its parameters."""
    item = registry.get(name)
    params = " ".join(f"{p.name}={p.default}" for p in declared(item)) \
        if isinstance(item, type) else ""
    return f"  {name:12} {registry.origin(name)}" + (f"  [{params}]" if params else "")


@click.command("plugins")
@click.option("-v", "--verbose", is_flag=True, help="also each topology parameter's help")
def plugins(verbose):
    """List the quantizers, compressors and topologies (built in and from entry
    points), where each comes from and a topology's parameters with their defaults."""
    lines = []
    try:  # everything loads before anything is printed: a broken plugin is one line
        for title, option, registry in registries():
            lines.append(f"{title} ({option}, entry points {registry.group}):")
            for name in registry.names():
                lines.append(describe(registry, name))
                item = registry.get(name)
                if verbose and isinstance(item, type):
                    lines += [f"      {p.describe()}" for p in declared(item)]
    except PluginError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo("\n".join(lines))
