"""``qaina-bench plot SWEEP_DIR``: the figure a sweep's spec asks for, from its sweep.csv.

The spec's ``plot`` section says what to draw::

    plot:
      title: text
      x: jobs                 # an axis of the grid (or a sweep.csv column)
      xlabel: concurrent jobs
      series: scheme          # axis (or list of axes): one line / bar colour each
      facet: workers          # optional axis: one row of panels per value
      kind: line              # line, or bar (one group of bars per x value)
      logx: false
      speedup_over: fp32 ring # bar: annotate every bar with the baseline's time / its
      panels:
        - {y: job_completion_s, ylabel: job completion time (s)}
        - {y: elements_per_s, ylabel: aggregate throughput (Melem/s), scale: 1.0e-6, logy: true}
        - {served: true, ylabel: jobs served}   # most jobs the pool held, per series

Each mark is the mean over a point's finished repeats; error bars span their range
(min to max) and the figure says how many repeats each mark has. A mark with a
repeat that was not network-bound (its ``fidelity`` verdict; for sweeps made before
the verdict, a saturated CPU: ``cpu_saturated``) is drawn hollow, and the figure's
footnote says so. The numbers behind every mark go to ``figures/<name>.csv`` and are
printed. A finished run whose value is not a finite number (text, nan, inf) is left
out of its panel with a warning naming it; a figure left without a mark is an error,
and nothing is written.
"""

from __future__ import annotations

import csv
import io
import math
import textwrap
import warnings
from pathlib import Path

import click
import numpy as np

from ..results.metrics import over_repeats
from ..results.resultset import read_text
from ..results.tables import printable
from .sweep import Spec, SweepError, plot_columns
from .sweeprun import CSV_FILE, SPEC_FILE

#: columns that do not depend on what bound the run: never drawn hollow
UNTIMED = {"rel_error", "register_bit_efficiency", "bytes_per_iteration", "bytes_sent",
           "steady_bytes_per_iteration", "switch_link_bytes",
           "slots_peak", "jobs_fit"}


def _number(value):
    """A cell as a float, or as it is where it is no finite number (``1e400``, ``nan``,
    text), or None where it is empty."""
    if value in (None, ""):
        return None
    if value in ("True", "False"):
        return float(value == "True")
    try:
        number = float(value)
    except ValueError:
        return value
    return number if math.isfinite(number) else value


def _key(value):
    """Sort key that puts numbers in order and text after them."""
    v = _number(value)
    return (0, v, "") if isinstance(v, float) else (1, 0.0, str(value))


def ordered(values) -> list:
    """Distinct values: numbers in order, otherwise as the spec lists them (rows come
    in point order)."""
    seen = list(dict.fromkeys(values))
    if all(isinstance(_number(v), float) for v in seen):
        return sorted(seen, key=_key)
    return seen


def load(sweep_dir: Path) -> tuple[Spec, list[dict]]:
    sweep_dir = Path(sweep_dir)
    if not (sweep_dir / SPEC_FILE).exists() or not (sweep_dir / CSV_FILE).exists():
        raise SweepError(f"{sweep_dir} is not a sweep directory (no {SPEC_FILE} and "
                         f"{CSV_FILE}): give the --out of a `qaina-bench sweep`")
    spec = Spec.load(sweep_dir / SPEC_FILE)
    try:  # a device or a pipe as sweep.csv would be read forever
        reader = csv.DictReader(io.StringIO(read_text(sweep_dir / CSV_FILE), newline=""))
        rows = [_whole_row(r, reader.line_num, sweep_dir / CSV_FILE) for r in reader]
    except SweepError:
        raise
    except OSError as exc:
        raise SweepError(f"{sweep_dir / CSV_FILE} is unreadable: {exc.strerror or exc}"
                         ) from None
    except (ValueError, csv.Error) as exc:  # not UTF-8 (a ValueError), not a file
        raise SweepError(f"{sweep_dir / CSV_FILE} is unreadable: {exc}") from None
    if rows and not {"status", "point"} <= set(rows[0]):
        raise SweepError(f"{sweep_dir / CSV_FILE} is not a sweep table (no status column)")
    return spec, rows


def _whole_row(row: dict, line: int, path: Path) -> dict:
    """``row`` if it has as many fields as the header; SweepError if not."""
    if None in row or None in row.values():  # csv's marks of a long and a short row
        raise SweepError(f"{path}: line {line} has {'more' if None in row else 'fewer'} "
                         "fields than the header: the table is damaged (running the same "
                         "`qaina-bench sweep` again rewrites it)")
    return row


def check_plot(spec: Spec, rows: list[dict]) -> dict:
    """The spec's plot section (its types checked when the spec was loaded) with its
    columns checked against sweep.csv's."""
    p = dict(spec.plot or {})
    if not p:
        raise SweepError(f"the spec of {spec.name} has no plot section")
    cols = set(rows[0]) if rows else set()
    for what, name in plot_columns(p):
        if not name or (rows and name not in cols):
            raise SweepError(f"plot: {what}{name!r} is not a column of {CSV_FILE}")
    series = p.get("series") or []
    p["series"] = [series] if isinstance(series, str) else list(series)
    return p


def not_network_bound(row: dict) -> bool:
    """Whether a run's timings measure the machine as much as the network: its
    fidelity verdict, or for a sweep made before the verdict its CPU saturation."""
    if row.get("fidelity"):
        return row["fidelity"] != "network-bound"
    return _number(row.get("cpu_saturated")) == 1.0


def marks(p: dict, rows: list[dict], y: str, facet_value=None,
          dropped: list | None = None) -> list[dict]:
    """One mark per (series, x): mean, min, max, repeats, and how many repeats were
    not network-bound (``hollow``), over finished runs whose ``y`` is a finite number;
    a mark whose repeats are too large to average is left out (and named in
    ``dropped``)."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        if r.get("status") != "complete" or not isinstance(_number(r.get(y)), float):
            continue
        if p.get("facet") and r.get(p["facet"]) != facet_value:
            continue
        key = (tuple(str(r.get(s)) for s in p["series"]), str(r.get(p["x"])))
        groups.setdefault(key, []).append(r)
    out = []
    for (series, x), rs in groups.items():
        with np.errstate(all="ignore"):
            stats = over_repeats([_number(r[y]) for r in rs])
        if not all(math.isfinite(stats[k]) for k in ("mean", "min", "max")):
            if dropped is not None:
                dropped.append(f"{y}: the mark at {p['x']}={x}"
                               f"{' of ' + ' '.join(series) if series else ''} is left out: "
                               "its repeats are too large to average")
            continue
        out.append({"series": " ".join(series) or y, "x": x, "y": y, **stats,
                    "hollow": 0 if y in UNTIMED else sum(map(not_network_bound, rs))})
    xs = ordered(r[p["x"]] for r in rows)
    names = ordered(" ".join(r[s] for s in p["series"]) or y for r in rows)
    return sorted(out, key=lambda m: (names.index(m["series"]), xs.index(m["x"])))


def served(p: dict, rows: list[dict], facet_value=None) -> list[dict]:
    """Per series: the most jobs of a point that completed, the fewest jobs the pool
    refused (the point where it runs out), and pool slots // slots per job."""
    out: dict[str, dict] = {}
    for r in rows:
        if p.get("facet") and r[p["facet"]] != facet_value:
            continue
        jobs = _number(r.get("jobs"))
        if not isinstance(jobs, float):  # left out (``left_out`` names it)
            continue
        name = " ".join(r[s] for s in p["series"])
        m = out.setdefault(name, {"series": name, "served": 0, "refused_at": None,
                                  "pool_holds": None})
        jobs = int(jobs)
        slots, pool = _number(r.get("slots")), _number(r.get("pool_slots"))
        if isinstance(slots, float) and isinstance(pool, float) and slots >= 1:
            m["pool_holds"] = int(pool) // int(slots)  # what the pool holds at this window
        if r["status"] == "complete":
            m["served"] = max(m["served"], jobs)
        elif r["status"] == "refused":
            m["refused_at"] = min(jobs, m["refused_at"] or jobs)
    names = ordered(" ".join(r[s] for s in p["series"]) for r in rows)
    return sorted(out.values(), key=lambda m: names.index(m["series"]))


def plot_sweep(sweep_dir: Path, echo=print, warn=None) -> list[Path]:
    """Draw the spec's figure; returns the files written. The finished runs a panel
    leaves out (their value is no finite number) are named by ``warn`` (default: a
    line on stderr); a figure with nothing left to draw is a SweepError, and then no
    file is written."""
    warn = warn or (lambda line: click.echo(line, err=True))
    sweep_dir = Path(sweep_dir)
    spec, rows = load(sweep_dir)
    p = check_plot(spec, rows)
    if not any(r["status"] == "complete" for r in rows):
        raise SweepError(f"{sweep_dir}: no run has finished yet (run the sweep first)")
    left = left_out(p, rows)
    out_dir = sweep_dir / "figures"
    png, data = out_dir / f"{spec.name}.png", out_dir / f"{spec.name}.csv"
    dropped: list[str] = []
    made = not out_dir.exists()
    try:
        out_dir.mkdir(exist_ok=True)
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")  # matplotlib on odd values: the table has them
            table = _draw(spec, p, rows, png, left, dropped)
        _write_table(data, table)
    except OSError as exc:
        raise SweepError(f"cannot write {out_dir}: {exc.strerror or exc}") from None
    except SweepError:
        if made and not any(out_dir.iterdir()):
            out_dir.rmdir()  # nothing drawn: no empty folder left either
        raise
    except (ValueError, OverflowError) as exc:  # values matplotlib cannot place
        raise SweepError(f"plot: cannot draw {png.name} from these values: {exc}") from None
    for line in left + dropped + empty_panels(p, table):
        warn(printable(f"warning: {line}"))
    _print_table(table, lambda line: echo(printable(line)))  # sweep.csv's text, as is
    return [png, data]


def _panel_column(panel: dict) -> str:
    """The sweep.csv column a panel draws: its ``y``, or ``jobs`` for jobs served."""
    return "jobs" if panel.get("served") else panel["y"]


def left_out(p: dict, rows: list[dict]) -> list[str]:
    """Per column a panel draws, the finished runs it leaves out because their value is
    not a finite number (text, nan, inf, 1e400): how many and which. An empty cell is
    a metric that does not apply (n/a): not a run left out."""
    out = []
    for y in dict.fromkeys(_panel_column(panel) for panel in p["panels"]):
        finished = ("complete", "refused") if y == "jobs" else ("complete",)
        bad = [r for r in rows if r.get("status") in finished
               and r.get(y) not in (None, "") and not isinstance(_number(r[y]), float)]
        if bad:
            runs = ", ".join(f"{r.get('run_id') or '?'} ({r[y][:20]!r})" for r in bad[:6])
            more = f" and {len(bad) - 6} more" if len(bad) > 6 else ""
            out.append(f"{y}: {len(bad)} run(s) left out, their value is not a finite "
                       f"number: {runs}{more}")
    return out


def empty_panels(p: dict, table: list[dict]) -> list[str]:
    """A line per panel of the figure that has no mark in any of its facets."""
    drawn = {m["y"] for m in table}
    return [f"panel {k + 1} ({_panel_column(panel)}) is empty: no finished run has a "
            "finite value of it" for k, panel in enumerate(p["panels"])
            if ("jobs_served" if panel.get("served") else panel["y"]) not in drawn]


def nothing_to_draw(p: dict, left: list[str]) -> SweepError:
    """The error of a figure without a mark: what was left out, and how to redo it."""
    columns = ", ".join(dict.fromkeys(_panel_column(panel) for panel in p["panels"]))
    why = ("; ".join(left) if left else f"no finished run has a value of {columns} (its "
           "cells are empty: the metric does not apply to these runs)")
    return SweepError(printable(f"plot: nothing to draw, no figure written: {why} (running "
                                "the same `qaina-bench sweep` again rewrites sweep.csv "
                                "from the runs' summaries)"))  # sweep.csv's text, as is


def _draw(spec: Spec, p: dict, rows: list[dict], png: Path, left: list[str],
          dropped: list[str]) -> list[dict]:
    """Draw the figure into ``png``; returns the numbers behind its marks (``dropped``
    gets the marks left out). SweepError, and no file, if it would have none."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    facets = (sorted({r[p["facet"]] for r in rows}, key=_key) if p.get("facet") else [None])
    panels = p["panels"]
    width = max(6.4, 4.6 * len(panels))
    fig, axes = plt.subplots(len(facets), len(panels), squeeze=False,
                             figsize=(width, 3.6 * len(facets) + 0.8))
    table = []
    try:
        for i, facet in enumerate(facets):
            for j, panel in enumerate(panels):
                ax = axes[i][j]
                made = (_served_panel(ax, p, rows, facet, panel) if panel.get("served")
                        else _panel(ax, p, rows, facet, panel, dropped))
                for m in made:
                    m["facet"] = "" if facet is None else f"{p['facet']}={facet}"
                table += made
                if facet is not None:
                    ax.set_title(f"{p['facet']} = {facet}", fontsize=9)
        if not table:
            raise nothing_to_draw(p, left)
        fig.suptitle("\n".join(textwrap.wrap(p.get("title") or spec.name, int(width * 11))),
                     fontsize=11)
        fig.text(0.01, 0.005, "\n".join(textwrap.wrap(_note(table), int(width * 17))),
                 fontsize=7)
        fig.tight_layout(rect=(0, 0.04, 1, 0.97))
        fig.savefig(png, dpi=120)
    finally:
        plt.close(fig)
    return table


def _note(table: list[dict]) -> str:
    """The figure's footnote: repeats per mark, and what the hollow marks mean."""
    hollow = sum(m.get("hollow", 0) for m in table)
    repeats = sorted({m["repeats"] for m in table if "repeats" in m})
    return (f"mean of {'/'.join(map(str, repeats))} repeat(s) per mark, bars: min to max. "
            + (f"Hollow marks, hatched bars: not network-bound in at least one repeat "
               f"({hollow} runs; the fidelity verdict, or a saturated CPU for runs made "
               "before it): the timing measures the machine as much as the network."
               if hollow else "No run behind these marks was judged other than "
               "network-bound."))


#: each line series' style and marker, by its place in the legend
LINES = ("-", "--", ":", "-.")
MARKERS = ("o", "s", "^", "D", "v", "P")


def _panel(ax, p, rows, facet, panel, dropped: list | None = None) -> list[dict]:
    """Draw one panel's marks (``dropped`` gets those left out); returns them."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
    y, scale = panel["y"], float(panel.get("scale", 1.0))
    ms = marks(p, rows, y, facet, dropped)
    ms = [m for m in ms if _scalable(m, scale, dropped)]  # none that overflows once scaled
    kind = p.get("kind", "line")
    names = list(dict.fromkeys(m["series"] for m in ms))
    xs = ordered(m["x"] for m in ms)
    colours = {n: f"C{k % 10}" for k, n in enumerate(names)}
    width = 0.8 / max(len(names), 1)
    if kind == "line":
        _check_line_x(p, xs)
    for k, name in enumerate(names):
        mine = [m for m in ms if m["series"] == name]
        pos = ([xs.index(m["x"]) + (k - (len(names) - 1) / 2) * width for m in mine]
               if kind == "bar" else [_number(m["x"]) for m in mine])
        mean = np.array([m["mean"] for m in mine]) * scale
        err = np.array([[m["mean"] - m["min"], m["max"] - m["mean"]] for m in mine]).T * scale
        hollow = [m["hollow"] > 0 for m in mine]
        if kind == "bar":
            colour = ([f"C{xs.index(m['x']) % 10}" for m in mine] if len(names) == 1
                      else colours[name])  # one series: a colour per bar
            ax.bar(pos, mean, width, yerr=err, capsize=3, color=colour, label=name,
                   edgecolor="black")
            for x, h, sat in zip(pos, mean, hollow):
                if sat:
                    ax.bar([x], [h], width, fill=False, hatch="//", edgecolor="white")
        else:  # a line style and marker per series: lines that coincide stay visible
            style, marker = LINES[k % len(LINES)], MARKERS[k % len(MARKERS)]
            size = 8 - 1.75 * (k % 3)  # smaller on top: a mark under another still shows
            ax.errorbar(pos, mean, yerr=err, capsize=3, color=colours[name], linestyle=style,
                        marker=None)
            ax.plot([], [], linestyle=style, marker=marker, color=colours[name], label=name)
            for x, v, sat in zip(pos, mean, hollow):
                ax.plot([x], [v], marker, color=colours[name], markersize=size,
                        markerfacecolor="white" if sat else colours[name])
    if kind == "bar":
        ax.set_xticks(range(len(xs)))
        ax.set_xticklabels(xs, rotation=15 if max(map(len, xs), default=0) > 8 else 0,
                           fontsize=8)
        base = p.get("speedup_over")
        if base:
            _speedups(ax, ms, base, xs, names, width, scale)
    elif p.get("logx"):
        ax.set_xscale("log")
        ax.set_xticks([_number(x) for x in xs])
        ax.set_xticklabels([f"{_number(x):g}" for x in xs])
        ax.xaxis.set_minor_formatter(NullFormatter())
    elif all(float(_number(x)).is_integer() for x in xs if isinstance(_number(x), float)):
        from matplotlib.ticker import MaxNLocator
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if panel.get("logy"):
        if ms and not any(m["mean"] * scale > 0 for m in ms):
            raise SweepError(f"plot: panel {y!r} has no mark above 0 to draw on a log axis "
                             "(logy: false draws them)")
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel(p.get("xlabel") or p["x"])
    ax.set_ylabel(panel.get("ylabel") or y)
    ax.grid(True, alpha=0.3)
    if names and names != [y]:
        ax.legend(fontsize=7)
    return ms


def _scalable(m: dict, scale: float, dropped: list | None) -> bool:
    """Whether mark ``m`` stays finite once scaled; if not, ``dropped`` says so."""
    if all(math.isfinite(m[k] * scale) for k in ("mean", "min", "max")):
        return True
    if dropped is not None:
        dropped.append(f"{m['y']}: the mark at {m['x']} of {m['series']} is left out: "
                       f"past the largest number once scaled by {scale:g}")
    return False


def _check_line_x(p: dict, xs: list):
    """A line puts each mark at its x: SweepError for an x that is no number (or,
    with logx, none above 0)."""
    for x in xs:
        v = _number(x)
        if not isinstance(v, float):
            raise SweepError(f"plot: x column {p['x']!r} holds {x!r}, not a number: a line "
                             "needs numbers on x (kind: bar draws any value)")
        if p.get("logx") and v <= 0:
            raise SweepError(f"plot: x column {p['x']!r} holds {x!r}: logx needs every x "
                             "above 0 (or logx: false)")


def _speedups(ax, ms, base, xs, names, width, scale):
    """Write baseline / this over every bar (the speed-up over the baseline)."""
    for m in ms:
        ref = [b for b in ms if b["x"] == base or b["series"] == base]
        if not ref:
            continue
        ref_mean = ref[0]["mean"]
        k = names.index(m["series"])
        x = xs.index(m["x"]) + (k - (len(names) - 1) / 2) * width
        m["speedup"] = ref_mean / m["mean"] if m["mean"] else math.nan
        ax.annotate(f"{m['speedup']:.1f}x", (x, m["max"] * scale), ha="center",
                    va="bottom", fontsize=8)


def _served_panel(ax, p, rows, facet, panel) -> list[dict]:
    ms = served(p, rows, facet)
    names = [m["series"] for m in ms]
    ax.bar(range(len(ms)), [m["served"] for m in ms],
           color=[f"C{k % 10}" for k in range(len(ms))], edgecolor="black")
    for k, m in enumerate(ms):
        label = (f"refused at {m['refused_at']}" if m["refused_at"] else "all fit")
        if m["pool_holds"] is not None:
            label += f"\n(pool holds {m['pool_holds']})"
        ax.annotate(label, (k, m["served"]), ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(ms)))
    ax.set_xticklabels(names, fontsize=8)
    ax.set_ylabel(panel.get("ylabel", "jobs served"))
    ax.set_xlabel("scheme")
    ax.grid(True, axis="y", alpha=0.3)
    return [{"y": "jobs_served", **m} for m in ms]


TABLE_COLUMNS = ["y", "facet", "series", "x", "mean", "min", "max", "repeats", "hollow", "speedup",
                 "served", "refused_at", "pool_holds"]


def _write_table(path: Path, table: list[dict]):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, TABLE_COLUMNS, extrasaction="ignore")
        w.writeheader()
        w.writerows(table)


def _fmt(v) -> str:
    if isinstance(v, (float, np.floating)):
        return f"{v:.4g}"
    return "" if v is None else str(v)


def _print_table(table: list[dict], echo):
    for m in table:
        if m["y"] == "jobs_served":
            echo(f"  jobs served {m['facet']:>10} {m['series']:>24}: {m['served']}"
                 + (f" (pool refused {m['refused_at']})" if m["refused_at"] else "")
                 + (f"; the pool holds {m['pool_holds']}" if m["pool_holds"] else ""))
            continue
        extra = f"  {m['speedup']:.2f}x" if m.get("speedup") else ""
        sat = (f"  [{m['hollow']}/{m['repeats']} not network-bound]" if m["hollow"]
               else "")
        series = "" if m["series"] == m["y"] else m["series"]
        echo(f"  {m['y']:>20} {m['facet']:>10} {series:>24} {str(m['x']):>10}: {_fmt(m['mean'])} "
             f"({_fmt(m['min'])}..{_fmt(m['max'])}, n={m['repeats']}){extra}{sat}")
