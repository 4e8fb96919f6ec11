"""Registries of the testbed's extension points: quantizers, topologies, modes, metrics.

Each kind has one ``Registry``. In-tree plugins register themselves where they are
defined (``QUANTIZERS.add("maxpow2", ...)`` or ``@TOPOLOGIES.register("star")``);
out-of-tree packages declare Python entry points in the registry's group, for example
in their ``pyproject.toml``::

    [project.entry-points."qaina_bench.quantizers"]
    mine = "my_package.module:MyQuantizer"

and are loaded the first time the registry is asked for its names or a plugin. The CLI
takes its choices from ``names()``, so a registered plugin is usable at once.
"""

from __future__ import annotations

from importlib import metadata
from typing import Callable, Generic, Iterator, TypeVar

T = TypeVar("T")


class PluginError(ValueError):
    """An unknown plugin name, a clash of names, or an entry point that does not load."""


class Registry(Generic[T]):
    """Plugins of one kind by name; entry points of ``group`` load on first use."""

    def __init__(self, kind: str, group: str):
        self.kind = kind
        self.group = group
        self._items: dict[str, T] = {}
        self._origin: dict[str, str] = {}
        self._loaded = False

    def add(self, name: str, item: T, origin: str = "built in") -> T:
        """Register ``item`` as ``name``; a name may be registered once."""
        if not isinstance(name, str) or not name or "," in name or name != name.strip():
            raise PluginError(f"{self.kind} name {name!r}: a non-empty word without commas")
        if name in self._items and self._items[name] is not item:
            raise PluginError(f"{self.kind} {name!r} is registered twice "
                              f"({self._origin[name]} and {origin})")
        self._items[name] = item
        self._origin[name] = origin
        return item

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator form of ``add``."""
        def decorate(item: T) -> T:
            return self.add(name, item)
        return decorate

    def get(self, name: str) -> T:
        """The plugin called ``name``; PluginError naming the choices if there is none."""
        self._load()
        try:
            return self._items[name]
        except (KeyError, TypeError):
            raise PluginError(f"unknown {self.kind} {name!r}: use one of "
                              f"{', '.join(self.names())}") from None

    def names(self) -> tuple[str, ...]:
        """Every registered name, built-in ones first, in registration order."""
        self._load()
        return tuple(self._items)

    def origin(self, name: str) -> str:
        """Where ``name`` came from: "built in" or the entry point's distribution."""
        self._load()
        return self._origin[name]

    def __contains__(self, name) -> bool:
        self._load()
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())

    def _load(self):
        if self._loaded:
            return
        self._loaded = True
        for point in metadata.entry_points(group=self.group):
            dist = getattr(point, "dist", None)
            origin = f"entry point {point.name} = {point.value}" + (
                f" ({dist.name} {dist.version})" if dist is not None else "")
            try:
                item = point.load()
            except Exception as exc:  # a broken plugin must say which one it is
                raise PluginError(f"{self.kind} plugin {point.name!r} ({point.value}) "
                                  f"does not load: {type(exc).__name__}: {exc}") from None
            self.add(point.name, item, origin)
