"""Topology parameters and the ``--topo`` spec: ``leafspine``, ``leafspine,2,4`` or
``leafspine,spines=2,leaves=4`` (Mininet's form).

A topology class declares its parameters once, in ``params`` (a tuple of ``Param``);
``parse_topo`` turns a spec into the class and its keyword arguments, checked, and
``TopoSpec.text`` writes the full spec back (every parameter with its value), which is
what a run records.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


class TopologyError(ValueError):
    """A ``--topo`` spec that cannot be built; the message is one line."""


@dataclass(frozen=True)
class Param:
    """One parameter of a topology: its name, type (int, float, str or bool), default
    (None: not set), help text, and the smallest and largest values a number may take
    (a float is finite)."""

    name: str
    type: type
    default: Any = None
    help: str = ""
    low: float | None = None
    high: float | None = None

    def convert(self, topo: str, value) -> Any:
        """``value`` (text from the spec, or a value from a config) as this type."""
        try:
            if self.type is bool and isinstance(value, str):
                if value.lower() not in _TRUE + _FALSE:
                    raise ValueError(value)
                out = value.lower() in _TRUE
            elif self.type is bool and not isinstance(value, bool):
                raise ValueError(value)
            elif self.type is int and isinstance(value, float) and not value.is_integer():
                raise ValueError(value)
            elif self.type in (int, float) and isinstance(value, bool):
                raise ValueError(value)
            else:
                out = self.type(value)
        except (TypeError, ValueError):
            raise TopologyError(f"--topo {topo}: {self.name}={value!r} is not "
                                f"{'an' if self.type is int else 'a'} "
                                f"{self.type.__name__}") from None
        if self.type is float and not math.isfinite(out):
            raise TopologyError(f"--topo {topo}: {self.name}={value!r} is not a finite number")
        if self.low is not None and out < self.low:
            raise TopologyError(f"--topo {topo}: {self.name}={out} is below its "
                                f"smallest value {self.low:g}")
        if self.high is not None and out > self.high:
            raise TopologyError(f"--topo {topo}: {self.name}={out} is above its "
                                f"largest value {self.high:g}")
        return out

    def describe(self) -> str:
        """``name=default (type): help`` for listings."""
        return f"{self.name}={self.default} ({self.type.__name__}): {self.help}".rstrip(": ")


@dataclass(frozen=True)
class TopoSpec:
    """A topology by name with every one of its parameters resolved."""

    name: str
    cls: type
    params: dict = field(default_factory=dict)

    def text(self) -> str:
        """The full spec, ``name,p1=v1,p2=v2`` in declared order (unset ones left out)."""
        return ",".join([self.name] + [f"{k}={_show(v)}" for k, v in self.params.items()
                                       if v is not None])

    def short(self) -> str:
        """The name and the parameters that differ from their defaults, for run ids:
        ``leafspine``, ``leafspine-leaves4``."""
        defaults = {p.name: p.default for p in declared(self.cls)}
        return "-".join([self.name] + [f"{k}{_show(v)}" for k, v in self.params.items()
                                       if v is not None and v != defaults.get(k)])

    def build(self, hosts: int, link, **extra):
        """The Mininet topology with ``hosts`` hosts and TCLink parameters ``link``."""
        return self.cls(hosts=hosts, link=link, **self.params, **extra)


def declared(cls) -> tuple[Param, ...]:
    """The parameters topology class ``cls`` declares (none if it declares none)."""
    return tuple(getattr(cls, "params", ()))


def _show(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def parse_topo(text: str, registry, fallback: dict | None = None) -> TopoSpec:
    """The topology ``text`` names, from ``registry``, with its parameters: positional
    values in declared order, then ``name=value`` ones; every parameter left out takes
    ``fallback[name]`` if given and not None (the old ``--spines``/``--leaves`` aliases),
    else its default. A fallback that differs from both the spec's value and the
    default is a clash. Raises TopologyError (one line) for anything wrong."""
    if not isinstance(text, str) or not text.strip():
        raise TopologyError(f"--topo {text!r}: give a topology name, e.g. "
                            f"{', '.join(registry.names())}")
    name, *values = [v.strip() for v in text.split(",")]
    try:
        cls = registry.get(name)
    except ValueError as exc:  # PluginError: unknown name, or a plugin that does not load
        raise TopologyError(str(exc)) from None
    params = declared(cls)
    by_name = {p.name: p for p in params}
    given: dict[str, Any] = {}
    keyword = False
    for pos, value in enumerate(values):
        if not value:
            raise TopologyError(f"--topo {text}: an empty value between commas")
        key, eq, val = value.partition("=")
        keyword = keyword or bool(eq)
        if not eq:
            if keyword:
                raise TopologyError(f"--topo {text}: a positional value after a "
                                    "name=value one")
            if pos >= len(params):
                raise TopologyError(f"--topo {text}: {name} takes "
                                    + (f"at most {len(params)} value(s) ({', '.join(by_name)})"
                                       if params else "no parameters"))
            key, val = params[pos].name, value
        key = key.strip()
        if key not in by_name:
            raise TopologyError(f"--topo {text}: {name} has no parameter {key!r} "
                                f"(it takes: {', '.join(by_name) or 'none'})")
        if key in given:
            raise TopologyError(f"--topo {text}: {key} is given twice")
        given[key] = by_name[key].convert(text, val.strip())
    return TopoSpec(name, cls, _resolved(text, params, given, fallback or {}))


def _resolved(text: str, params, given: dict, fallback: dict) -> dict:
    out = {}
    for p in params:
        alias = fallback.get(p.name)
        alias = None if alias is None else p.convert(f"{text} with --{p.name}", alias)
        if p.name in given:
            if alias is not None and alias not in (given[p.name], p.default):
                raise TopologyError(f"--topo {text} sets {p.name}={_show(given[p.name])} "
                                    f"and --{p.name} {_show(alias)}: give it once")
            out[p.name] = given[p.name]
        else:
            out[p.name] = p.default if alias is None else alias
    return out
