"""The command-line options of a run, made from the configuration tree (``settings.py``).

Every option of ``up`` and ``run`` is a field of the tree: its flag, default, type and
help come from the field, so a config.yaml key, a sweep-spec key and a flag are one
name with one default. Options given on the command line override a config file;
``up --help`` lists them under one heading per section.
"""

from __future__ import annotations

import math
from dataclasses import fields

import click
from click.core import ParameterSource

from ..settings import SECTIONS, ConfigError, Settings, choices_of, default_of, flag_of, kind_of
from .plugincli import RegistryChoice


class IntList(click.ParamType):
    """``4`` or ``4,32``: one whole number, or a comma-separated list of them."""

    def __init__(self, what: str = "bit width", name: str = "BITS"):
        self.what, self.name = what, name

    def convert(self, value, param, ctx):
        if isinstance(value, list):
            return value
        try:
            return [int(v) for v in str(value).split(",")]
        except ValueError:
            self.fail(f"{value!r} is not a {self.what} or a comma-separated list of them",
                      param, ctx)


class Positive(click.FloatRange):
    """A finite number above 0 (rates, durations, learning rates): ``click.FloatRange``
    lets nan and inf through."""

    name = "positive number"

    def __init__(self):
        super().__init__(min=0, min_open=True)

    def convert(self, value, param, ctx):
        out = super().convert(value, param, ctx)
        if not math.isfinite(out):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return out


class SectionOption(click.Option):
    """An option that knows its section of the tree (for the grouped help)."""

    def __init__(self, *args, section: str = "", **kwargs):
        super().__init__(*args, **kwargs)
        self.section = section


class SectionedCommand(click.Command):
    """A command whose help lists the tree's options under one heading per section."""

    def format_options(self, ctx, formatter):
        groups: dict[str, list] = {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is not None:
                groups.setdefault(getattr(param, "section", "") or "other", []).append(record)
        for title in list(SECTIONS) + ["other"]:
            if groups.get(title):
                with formatter.section(f"{title.capitalize()} options"):
                    formatter.write_dl(groups[title])


def _shown(value) -> str:
    return ",".join(map(str, value)) if isinstance(value, list) else str(value)


class _Names:
    """A function of names as the registry ``RegistryChoice`` reads."""

    def __init__(self, names):
        self.names = lambda: tuple(str(n) for n in names())


def _click_option(section: str, f) -> click.Option:
    """The click option of field ``f``: type, default and help from the field."""
    kind, _ = kind_of(SECTIONS[section], f.name)
    default = default_of(f)
    kw = {"help": f.metadata.get("help", ""), "section": section, "cls": SectionOption,
          "metavar": f.metadata.get("metavar")}
    choices = f.metadata.get("choices")
    flag = flag_of(f)
    if kind is bool:
        name = f.name.replace("_", "-")
        return click.option(f"--{name}/--no-{name}", f.name, default=default,
                            show_default=True, **kw)
    if kind == list[str]:
        return click.option(flag, f.name, multiple=True, type=click.Path(), **kw)
    if callable(choices):  # a registry's names: read when needed, plugins included
        typ = RegistryChoice(_Names(choices))
    elif choices is not None:
        typ = click.Choice([str(c) for c in choices_of(f)])
    else:
        typ = {int: int, float: float, str: str,
               list[int]: IntList("bit width" if f.name == "bits" else "layer size",
                                  "BITS" if f.name == "bits" else "SIZES")}[kind]
    return click.option(flag, f.name, type=typ,
                        default=None if default is None else _shown(default),
                        show_default=default is not None, **kw)


def tree_options(func):
    """Decorate a command with an option for every field of the tree."""
    for section, cls in reversed(list(SECTIONS.items())):
        for f in reversed(fields(cls)):
            func = _click_option(section, f)(func)
    return func


def given_options(ctx: click.Context, opts: dict) -> dict:
    """The tree's options given on the command line (not left at their defaults), as
    the tree's types; removes every tree option from ``opts``."""
    given = {}
    for section, cls in SECTIONS.items():
        for f in fields(cls):
            value = opts.pop(f.name)
            if ctx.get_parameter_source(f.name) in (ParameterSource.DEFAULT, None):
                continue
            kind, _ = kind_of(cls, f.name)
            if kind is int and isinstance(value, str):
                value = int(value)
            given[f.name] = list(value) if isinstance(value, tuple) else value
    return given


def config_from(ctx: click.Context, opts: dict, base: Settings) -> Settings:
    """``base`` with the options given on the command line replacing its own."""
    try:
        return base.with_overrides(given_options(ctx, opts), "the command line")
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from None
