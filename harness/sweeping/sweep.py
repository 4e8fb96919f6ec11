"""Sweeps: the cross product of a spec's options, one result set per point and repeat.

A sweep spec (YAML, see ``experiments/README.md``) holds:

``name``            the sweep's name (letters, digits, ``.``, ``_``, ``-``)
``base``            run options every point shares (``qaina-bench up``'s, flat or by section
                    as in a config.yaml)
``grid``            axes to cross, in order: a run option with its list of values, or a
                    named axis whose values are mappings ``{label: ..., option: value}``
``repeats``         runs of every point (the plots show their mean and spread); the
                    k-th repeat runs with seed + k - 1 unless the grid sets the seed
``window_elements`` optional: every job keeps this many gradient elements in flight,
                    so its slots are ceil(E / (payload words x values per word))
``traces``          optional: trace sets to record first if they are missing
``plot``            the figure ``qaina-bench plot`` draws (``harness/sweeping/figures.py``)
``quick``           optional: replaces parts of the spec for ``--quick`` (per grid axis)

A sweep directory holds ``spec.yaml`` (the resolved spec), ``runs/<run-id>/`` (one
result set per point and repeat), ``sweep.csv`` (their summaries joined, one row per
run; ``harness/sweeping/sweepcsv.py``) and ``sweep.log`` (what the runs printed). A point whose
run finished is skipped when the sweep is run again, so Ctrl-C loses at most the run
under way (its result set stays, renamed ``<run-id>.attempt<N>``).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

from ...hosts.lanes import LaneError, LaneFormat
from ...settings import SECTION_OF, SECTIONS
from ..config import (MAX_YAML, RUN_ID, ConfigError, PoolError, RunConfig, TraceMissing,
                      parse_yaml, yaml_limit, yaml_problem)
from ..results.resultset import read_text
from ..results.tables import CONTROL
from .sweepcsv import columns, run_row

SPEC_KEYS = {"name", "description", "base", "grid", "repeats", "window_elements", "traces",
             "plot", "quick"}
#: options the sweep sets itself
RESERVED = {"results_dir", "run_id"}
OPTIONS = set(SECTION_OF) - RESERVED
MAX_RUNS = 10_000  # runs of one sweep
MAX_PANELS = 12  # panels of one figure, one above the other
TRACE_KEYS = {"name", "model", "hidden", "workers", "iterations", "dtype", "seed", "width",
              "lr", "batch_size"}
PLOT_KEYS = {"title", "x", "xlabel", "series", "facet", "kind", "logx", "speedup_over",
             "panels"}
PANEL_KEYS = {"y", "ylabel", "scale", "logy", "served"}


class SweepError(ValueError):
    """A spec or sweep directory that cannot be used; the message says how to fix it."""


@dataclass
class Point:
    """One combination of the grid's values."""

    index: int
    values: dict  # axis -> value (a variant axis: its label)
    options: dict  # run options of this point beyond the base

    def describe(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.values.items())


@dataclass
class Spec:
    name: str
    base: dict
    grid: dict
    repeats: int = 1
    window_elements: int | None = None
    traces: list | None = None
    plot: dict | None = None
    description: str = ""
    path: str = ""

    # -- loading -----------------------------------------------------------------------
    @classmethod
    def load(cls, path, quick: bool = False) -> "Spec":
        where = str(path)
        try:
            data = parse_yaml(read_text(Path(path), MAX_YAML))
        except FileNotFoundError:
            raise SweepError(f"sweep spec {where} does not exist") from None
        except UnicodeDecodeError:
            raise SweepError(f"sweep spec {where} is not text") from None
        except OSError as exc:
            raise SweepError(f"sweep spec {where}: {exc.strerror}") from None
        except yaml.YAMLError as exc:
            raise SweepError(f"sweep spec {where} is not valid YAML{yaml_problem(exc)}"
                             ) from None
        except (RecursionError, ValueError) as exc:  # a device or pipe, too large or deep
            raise SweepError(f"sweep spec {where}: {yaml_limit(exc)}") from None
        return cls.from_dict(data, where, quick)

    @classmethod
    def from_dict(cls, data, where: str, quick: bool = False) -> "Spec":
        if not isinstance(data, dict):
            raise SweepError(f"{where}: a sweep spec is a mapping (name, base, grid, ...)")
        unknown = sorted(str(k) for k in set(data) - SPEC_KEYS)
        if unknown:
            raise SweepError(f"{where}: unknown key(s) {', '.join(unknown)}; "
                             f"known: {', '.join(sorted(SPEC_KEYS))}")
        _no_control(data, where)
        data = dict(data)
        if quick:
            data = _apply_quick(data, where)
        data.pop("quick", None)
        name = data.get("name")
        if not isinstance(name, str) or not RUN_ID.fullmatch(name) or len(name) > 60:
            raise SweepError(f"{where}: name must be a short name (letters, digits, '.', '_', "
                             f"'-'), got {name!r}")
        base = flatten(_mapping(data.get("base", {}), f"{where}: base"), f"{where}: base")
        spec = cls(name=name, base=base,
                   grid=_grid(data.get("grid"), where),
                   repeats=_whole(data.get("repeats", 1), f"{where}: repeats", 1, 100),
                   window_elements=(None if data.get("window_elements") is None else _whole(
                       data["window_elements"], f"{where}: window_elements", 1, 10**9)),
                   traces=_traces(data.get("traces"), where),
                   plot=_plot(data.get("plot", {}), f"{where}: plot"),
                   description=str(data.get("description", "")), path=where)
        _options(spec.base, f"{where}: base")
        return spec

    def to_yaml(self) -> str:
        out = {k: v for k, v in asdict(self).items() if k != "path" and v not in (None, "")}
        return yaml.safe_dump(out, sort_keys=False)

    # -- points ------------------------------------------------------------------------
    def points(self) -> list[Point]:
        axes = list(self.grid.items())
        out = []
        for index, combo in enumerate(itertools.product(*(values for _, values in axes))):
            values, options = {}, {}
            for (axis, _), value in zip(axes, combo):
                if isinstance(value, dict):
                    values[axis] = value["label"]
                    options.update({k: v for k, v in value.items() if k != "label"})
                else:
                    values[axis] = value
                    options[axis] = value
            out.append(Point(index, values, options))
        return out

    def config(self, point: Point, sweep_dir: Path, repeat: int) -> RunConfig:
        """The run configuration of ``point``'s ``repeat``-th run (ConfigError if bad)."""
        where = f"point {point.index} ({point.describe()})"
        cfg = RunConfig.from_dict(self.base, where).with_overrides(
            {**point.options, "results_dir": str(sweep_dir / "runs"),
             "run_id": run_id(self, point, repeat)}, where)
        if self.window_elements is not None and "slots" not in {**self.base, **point.options}:
            try:
                cfg.workload.slots = slots_for(self.window_elements, cfg)
            except LaneError as exc:  # a width or worker count no job can have
                raise ConfigError(f"{where}: {exc}") from None
        if "seed" not in point.options:  # repeats differ in the agents' random streams
            cfg.workload.seed += repeat - 1
        return cfg


def _apply_quick(data: dict, where: str) -> dict:
    quick = data.get("quick")
    if quick is None:
        return data
    quick = _mapping(quick, f"{where}: quick")
    bad = sorted(set(quick) - (SPEC_KEYS - {"name", "quick", "plot"}))
    if bad:
        raise SweepError(f"{where}: quick may replace base, grid, repeats, window_elements, "
                         f"traces, description; not {', '.join(bad)}")
    out = dict(data)
    for key, value in quick.items():
        if key in ("base", "grid") and isinstance(value, dict):
            old = data.get(key) or {}
            out[key] = ({**flatten(_mapping(old, f"{where}: base"), where),
                         **flatten(value, f"{where}: quick")}
                        if key == "base" else {**old, **value})
        else:
            out[key] = value
    return out


def _mapping(value, where: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise SweepError(f"{where} must be a mapping")
    return dict(value)


def _whole(value, where: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise SweepError(f"{where} must be a whole number in {low}..{high}, got {value!r}")
    return value


def flatten(opts: dict, where: str) -> dict:
    """Run options by name: a section of the tree (``network: {topo: star}``) stands
    for its options; SweepError for an option given twice."""
    out: dict = {}
    for key, value in opts.items():
        part = value if key in SECTIONS and isinstance(value, dict) else {key: value}
        twice = sorted(str(k) for k in set(part) & set(out))
        if twice:
            raise SweepError(f"{where}: {', '.join(twice)} given twice")
        out.update(part)
    return out


def _options(opts: dict, where: str):
    unknown = sorted(str(k) for k in set(opts) - OPTIONS)
    if unknown:
        hint = " (the sweep sets results_dir and run_id)" if set(unknown) & RESERVED else ""
        raise SweepError(f"{where}: unknown run option(s) {', '.join(unknown)}{hint}; "
                         f"known: {', '.join(sorted(OPTIONS))}")


def _grid(grid, where: str) -> dict:
    if not isinstance(grid, dict) or not grid:
        raise SweepError(f"{where}: grid must map at least one axis to its values")
    out = {}
    for axis, values in grid.items():
        if not isinstance(values, list) or not values:
            raise SweepError(f"{where}: grid axis {axis!r} needs a non-empty list of values")
        variants = [v for v in values if isinstance(v, dict)]
        if variants and len(variants) != len(values):
            raise SweepError(f"{where}: grid axis {axis!r} mixes plain values and variants")
        if variants:
            labels = []
            for v in variants:
                if "label" not in v:
                    raise SweepError(f"{where}: every variant of axis {axis!r} needs a label")
                _options({k: x for k, x in v.items() if k != "label"},
                         f"{where}: axis {axis!r} variant {v['label']!r}")
                labels.append(str(v["label"]))
            if len(set(labels)) != len(labels):
                raise SweepError(f"{where}: axis {axis!r} repeats a label")
        else:
            _options({axis: None}, f"{where}: grid")
        out[str(axis)] = values
    return out


def _traces(traces, where: str) -> list | None:
    """Trace sets to record first: a recipe's name (``hosts/recorder.RECIPES``) or a
    mapping of ``traces record`` options with a name."""
    from ...hosts.recorder import RECIPES, check_options
    from ...hosts.traces import TraceError, check_set_name
    if traces is None:
        return None
    if not isinstance(traces, list):
        raise SweepError(f"{where}: traces must be a list of trace sets to record")
    for t in traces:
        if isinstance(t, str):
            if t not in RECIPES:
                raise SweepError(f"{where}: trace {t!r} has no recipe (known: "
                                 f"{', '.join(RECIPES)}); give its options as a mapping")
            continue
        if not isinstance(t, dict) or "name" not in t:
            raise SweepError(f"{where}: every trace to record needs a name")
        bad = sorted(set(t) - TRACE_KEYS)
        if bad:
            raise SweepError(f"{where}: trace {t['name']!r}: unknown key(s) {', '.join(bad)}; "
                             f"known: {', '.join(sorted(TRACE_KEYS))}")
        try:  # said now, not after the sets before it are recorded
            check_set_name(t["name"])
            check_options(**_recipe(t))
        except TraceError as exc:
            raise SweepError(f"{where}: trace {t['name']!r}: {exc}") from None
    return traces


def _plot(plot, where: str) -> dict:
    """The plot section with its keys and their types checked (``figures.py`` checks
    its columns against sweep.csv); empty if the spec draws nothing."""
    plot = _mapping(plot, where)
    if not plot:
        return plot
    _known(plot, PLOT_KEYS, where)
    for key in ("title", "x", "xlabel", "facet", "speedup_over"):
        _text(plot.get(key), f"{where}: {key}")
    if plot.get("x") is None:
        raise SweepError(f"{where}: give x, the axis (or sweep.csv column) across the plot")
    series = plot.get("series")
    if not isinstance(series, (str, type(None))) and not (
            isinstance(series, list) and all(isinstance(s, str) for s in series)):
        raise SweepError(f"{where}: series must be an axis or a list of axes, got {series!r}")
    if plot.get("kind", "line") not in ("line", "bar"):
        raise SweepError(f"{where}: kind is line or bar, got {plot['kind']!r}")
    _flag(plot.get("logx"), f"{where}: logx")
    panels = plot.get("panels")
    if isinstance(panels, list) and len(panels) > MAX_PANELS:  # a figure as tall as them
        raise SweepError(f"{where}: {len(panels)} panels; a figure takes at most {MAX_PANELS}")
    if not isinstance(panels, list) or not panels:
        raise SweepError(f"{where}: panels must be a list of at least one panel "
                         f"({', '.join(sorted(PANEL_KEYS))})")
    for n, panel in enumerate(panels, 1):
        _panel(panel, f"{where}: panel {n}")
    return plot


def plot_columns(plot: dict) -> list[tuple[str, str]]:
    """(what it is, sweep.csv column) for every column the plot section draws from."""
    series = plot.get("series") or []
    out = [("", plot.get("x"))] + [("", s) for s in
                                   ([series] if isinstance(series, str) else series)]
    out += [("", plot["facet"])] if plot.get("facet") else []
    return out + [("panel y ", panel.get("y")) for panel in plot.get("panels", [])
                  if not panel.get("served")]


def check_plot_columns(spec: Spec):
    """SweepError if the plot section names a column sweep.csv will not have: said
    before the sweep runs, not when it is plotted."""
    if not spec.plot:
        return
    known = set(columns(list(spec.grid)))
    for what, name in plot_columns(spec.plot):
        if name not in known:
            raise SweepError(f"{spec.path}: plot: {what}{name!r} is not a column of sweep.csv "
                             "(an axis of the grid, a configuration or a metric column: "
                             "README's glossary lists them)")


def _panel(panel, where: str):
    """One panel of the plot section: a y column (or ``served``), its types checked."""
    if not isinstance(panel, dict):
        raise SweepError(f"{where} must be a mapping of {', '.join(sorted(PANEL_KEYS))}")
    _known(panel, PANEL_KEYS, where)
    _flag(panel.get("served"), f"{where}: served")
    _flag(panel.get("logy"), f"{where}: logy")
    _text(panel.get("ylabel"), f"{where}: ylabel")
    _text(panel.get("y"), f"{where}: y")
    if not panel.get("served") and panel.get("y") is None:
        raise SweepError(f"{where}: give y, the sweep.csv column it draws (or served: true)")
    if "scale" in panel:
        try:
            scale = float(panel["scale"])
        except (TypeError, ValueError, OverflowError):
            scale = math.nan
        if isinstance(panel["scale"], bool) or not math.isfinite(scale) or scale <= 0:
            raise SweepError(f"{where}: scale must be a number above 0 (e.g. 1.0e-6), "
                             f"got {panel['scale']!r}")


def _known(section: dict, keys: set, where: str):
    bad = sorted(str(k) for k in set(section) - keys)
    if bad:
        raise SweepError(f"{where}: unknown key(s) {', '.join(bad)}; known: "
                         f"{', '.join(sorted(keys))}")


def _no_control(value, where: str, key=None):
    """SweepError for a control character in any key or text of the spec; keys and
    labels (they name options, runs and columns) take no tab or line break either."""
    if isinstance(value, dict):
        for k, item in value.items():
            _no_control(k, where, "label")
            _no_control(item, where, k)
    elif isinstance(value, list):
        for item in value:
            _no_control(item, where, key)
    elif isinstance(value, str):
        if CONTROL.search(value):  # would reach the terminal and the figures as they are
            raise SweepError(f"{where}: {value!r} holds a control character")
        if key == "label" and ("\n" in value or "\t" in value):
            raise SweepError(f"{where}: {value!r} holds a tab or a line break (a label or "
                             "a key names runs and columns: one line)")


def _text(value, where: str):
    if value is not None and not isinstance(value, str):
        raise SweepError(f"{where} must be text (quote it), got {value!r}")


def _flag(value, where: str):
    if value is not None and not isinstance(value, bool):
        raise SweepError(f"{where} must be true or false, got {value!r}")


def trace_names(spec: "Spec") -> set[str]:
    return {t if isinstance(t, str) else t["name"] for t in spec.traces or []}


def slots_for(elements: int, cfg: RunConfig) -> int:
    """Slots a job of ``cfg`` needs to keep ``elements`` values in flight: one slot
    carries payload words x lanes values (the widest format of the run's jobs)."""
    fmt = [LaneFormat(b, cfg.workload.workers, cfg.compression.pack) for b in cfg.job_bits()]
    per_slot = min(cfg.network.payload_words * f.lanes for f in fmt)
    return max(1, math.ceil(elements / per_slot))


def run_id(spec: Spec, point: Point, repeat: int) -> str:
    return f"{spec.name}-p{point.index:03d}-r{repeat}"


def comparable(cfg: RunConfig) -> dict:
    """What must match for a stored run to count as this point's."""
    out = cfg.flat_dict()
    out.pop("results_dir")
    out.pop("trace_dirs")
    try:  # the full topology spec: a run stored before specs were recorded matches too
        out["topo"] = cfg.topology().text()
    except ConfigError:
        pass
    return out


def spec_digest(spec: Spec) -> str:
    return hashlib.sha256(json.dumps(
        {"grid": spec.grid, "base": spec.base, "window": spec.window_elements},
        sort_keys=True, default=str).encode()).hexdigest()[:12]


# -- a sweep directory -------------------------------------------------------------------
@dataclass
class Task:
    """One run of the sweep: a point's repeat, or a point the pool cannot hold."""

    point: Point
    repeat: int
    cfg: RunConfig | None
    refused: str | None = None  # why the run cannot be started (a pool too small)

    @property
    def directory(self) -> Path | None:
        return Path(self.cfg.output.results_dir) / self.cfg.output.run_id if self.cfg else None


def plan(spec: Spec, sweep_dir: Path) -> list[Task]:
    """Every run of the sweep, each checked before anything starts: a spec error
    raises SweepError, a point that does not fit the slot pool is kept as refused.
    A trace set the spec records (``traces``) may be missing yet."""
    runs = math.prod(len(v) for v in spec.grid.values()) * spec.repeats
    if runs > MAX_RUNS:
        raise SweepError(f"{spec.path}: the grid makes {runs} runs, more than {MAX_RUNS}: "
                         "split the sweep into several specs")
    check_plot_columns(spec)
    tasks = []
    recorded = trace_names(spec)
    opened: dict = {}  # each trace set opened once
    for point in spec.points():
        for repeat in range(1, spec.repeats + 1):
            try:
                cfg = spec.config(point, sweep_dir, repeat)
                cfg.check(opened)
            except PoolError as exc:
                tasks.append(Task(point, repeat, None, str(exc)))
                continue
            except TraceMissing as exc:
                if cfg.training.trace not in recorded:
                    raise SweepError(f"{spec.path}: point {point.index} "
                                     f"({point.describe()}): {exc}") from None
            except ConfigError as exc:  # said of the point once (``config`` may have)
                where = f"point {point.index} ({point.describe()}): "
                raise SweepError(f"{spec.path}: {where}{str(exc).removeprefix(where)}") from None
            tasks.append(Task(point, repeat, cfg))
    return tasks


def stored_status(task: Task) -> str | None:
    """The status of the task's stored run ('complete', 'failed', ...), None if none;
    SweepError if the stored run is of another configuration."""
    d = task.directory
    if d is None or not d.exists():
        return None
    try:
        stored = RunConfig.from_yaml(d / "config.yaml")
    except ConfigError:
        return "unreadable"
    have, want = comparable(stored), comparable(task.cfg)
    if have != want:
        diff = sorted(k for k, v in want.items() if have.get(k) != v)
        raise SweepError(f"{d} was run with other options ({', '.join(diff)}) than the spec "
                         "now gives: use another --out, or remove that directory")
    try:
        summary = json.loads(read_text(d / "summary.json"))
    except (OSError, ValueError, RecursionError):
        return "unreadable"
    status = summary.get("status") if isinstance(summary, dict) else None
    if status == "complete":  # and its metrics can be read, or it is run again
        return run_row(d)["status"]
    return status if isinstance(status, str) else "unreadable"


def set_aside(directory: Path) -> Path:
    """Keep an unfinished run's result set under a new name; returns it."""
    for n in itertools.count(1):
        target = directory.with_name(f"{directory.name}.attempt{n}")
        if not target.exists():
            shutil.move(str(directory), str(target))
            return target


def prepare_traces(spec: Spec, echo) -> None:
    """Record the trace sets the spec needs that cannot be found (user's directory)."""
    from ...hosts.recorder import ensure
    from ...hosts.traces import TraceError
    for t in spec.traces or []:
        name, recipe = (t, None) if isinstance(t, str) else (t["name"], _recipe(t))
        start = time.monotonic()
        try:
            ensure(name, spec.base.get("trace_dirs"), echo, recipe)
        except (TraceError, ImportError, ValueError) as exc:
            raise SweepError(f"recording trace set {name} failed: {exc}") from None
        if time.monotonic() - start > 1:
            echo(f"  recorded in {time.monotonic() - start:.0f} s")


def _recipe(t: dict) -> dict:
    """``record``'s options from a spec's trace mapping."""
    out = {k: v for k, v in t.items() if k not in ("name", "lr")}
    if isinstance(out.get("hidden"), list):
        out["hidden"] = tuple(out["hidden"])
    if "lr" in t:
        out["learning_rate"] = t["lr"]
        if isinstance(t["lr"], str):  # YAML reads 1e-3 (no dot) as text
            try:
                out["learning_rate"] = float(t["lr"])
            except ValueError:
                pass
    return out
